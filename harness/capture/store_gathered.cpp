// WriteMode::gathered: rank 0 writes the run file alone; the other ranks
// send it their tap rows and reference boxes over MPI, in pieces of bounded
// size (for directories each host has its own of, and for small files).
#include <cstdlib>
#include <map>
#include <vector>

#include "harness/capture/store_layout.h"
#include "harness/core/error.h"

namespace dc {
namespace {

using h5::Handle;

// Elements per piece: kGatherElements, or DIFFCHECK_GATHER_ELEMENTS (tests
// use small pieces to reach every boundary with small tensors).
std::size_t gather_piece_elements() {
  static const std::size_t n = [] {
    const char* v = std::getenv("DIFFCHECK_GATHER_ELEMENTS");
    const long long x = v ? std::atoll(v) : 0;
    return x > 0 ? static_cast<std::size_t>(x) : kGatherElements;
  }();
  return n;
}

// A tensor of `shape` travels in pieces of whole slices along its first
// dimension, at most gather_piece_elements() each (one slice when a slice is
// larger).
template <class F>
void for_each_piece(const Shape& shape, F&& f) {
  const std::size_t n = numel(shape);
  if (n == 0) return;
  if (shape.empty()) return f(std::size_t{0}, std::size_t{1}, std::size_t{1});
  const std::size_t inner = n / shape[0];
  const std::size_t rows = std::max<std::size_t>(1, gather_piece_elements() / inner);
  for (std::size_t i0 = 0; i0 < shape[0]; i0 += rows) {
    const std::size_t k = std::min(rows, shape[0] - i0);
    f(i0, k, k * inner);
  }
}

// Writes `data` (row-major, `count` elements per dimension) at `start` of `ds`.
void write_box(hid_t ds, hid_t mem_type, const void* data, const std::vector<hsize_t>& start,
               const std::vector<hsize_t>& count, const std::string& what) {
  Handle fspace(H5Dget_space(ds));
  if (start.empty()) {
    H5Sselect_all(fspace.get());
  } else {
    H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  }
  hsize_t n = 1;
  for (auto c : count) n *= c;
  Handle mspace(H5Screate_simple(1, &n, nullptr));
  if (H5Dwrite(ds, mem_type, mspace.get(), fspace.get(), H5P_DEFAULT, data) < 0)
    fail("rank 0: HDF5 write of '{}' failed: {}", what, h5::last_error());
}

}  // namespace

void send_rows_and_boxes(const Comm& world, const TapRecorder& taps,
                         const std::map<std::string, ReferenceEntry>& manifest) {
  for (const auto& r : taps.records())
    for_each_piece(r.local.shape, [&](std::size_t i0, std::size_t, std::size_t n) {
      const std::size_t inner = r.local.shape.empty() ? 1 : numel(r.local.shape) / r.local.shape[0];
      world.send(std::span<const float>(r.local.ptr() + i0 * inner, n), 0);
    });
  for (const auto& [name, entry] : manifest) {
    auto it = taps.references().find(name);
    if (it == taps.references().end()) continue;
    for (const auto& b : it->second.blocks)
      for_each_piece(b.data.shape, [&](std::size_t i0, std::size_t, std::size_t n) {
        const std::size_t inner = b.data.shape.empty() ? 1 : b.data.size() / b.data.shape[0];
        world.send(std::span<const double>(b.data.ptr() + i0 * inner, n), 0);
      });
  }
}

// Rank 0: every tap row and reference box, its own from memory and the
// others' as they arrive, in the order they are sent.
void receive_and_write(hid_t file, const Comm& world, const TapRecorder& taps,
                       const std::map<std::string, ReferenceEntry>& manifest,
                       const std::map<std::string, std::vector<HeldBox>>& boxes) {
  const int P = world.size();
  std::vector<float> fbuf;
  std::vector<double> dbuf;
  for (const auto& r : taps.records()) {
    Handle ds = create_tap(file, r, taps, P, 0);
    const std::string what = "/taps/" + r.name;
    for (int src = 0; src < P; ++src)
      for_each_piece(r.local.shape, [&](std::size_t i0, std::size_t k, std::size_t n) {
        std::vector<hsize_t> start{static_cast<hsize_t>(src)}, count{1};
        for (std::size_t d = 0; d < r.local.shape.size(); ++d) {
          start.push_back(d == 0 ? i0 : 0);
          count.push_back(d == 0 ? k : r.local.shape[d]);
        }
        const float* data = r.local.ptr() + i0 * (n / std::max<std::size_t>(k, 1));
        if (src != 0) {
          fbuf.resize(n);
          world.recv(std::span<float>(fbuf), src);
          data = fbuf.data();
        }
        write_box(ds.get(), H5T_NATIVE_FLOAT, data, start, count, what);
      });
  }
  for (const auto& [name, entry] : manifest) {
    const std::string what = "/reference/" + name;
    Handle ds = create_dataset(file, what, H5T_IEEE_F64LE, entry.shape, 0);
    std::size_t mine = 0;  // rank 0's boxes of this reference, in order
    static const std::vector<HeldBox> none;
    const auto it = boxes.find(name);
    for (const HeldBox& box : it == boxes.end() ? none : it->second) {
      const double* local = box.rank == 0 ? taps.references().at(name).blocks.at(mine++).data.ptr() : nullptr;
      for_each_piece(box.shape, [&](std::size_t i0, std::size_t k, std::size_t n) {
        std::vector<hsize_t> at(box.start.begin(), box.start.end()), count(box.shape.begin(), box.shape.end());
        if (!at.empty()) {
          at[0] += i0;
          count[0] = k;
        }
        const double* data = local ? local + i0 * (n / std::max<std::size_t>(k, 1)) : nullptr;
        if (box.rank != 0) {
          dbuf.resize(n);
          world.recv(std::span<double>(dbuf), box.rank);
          data = dbuf.data();
        }
        write_box(ds.get(), H5T_NATIVE_DOUBLE, data, at, count, what);
      });
    }
  }
}

}  // namespace dc
