#include "harness/capture/h5_data.h"
#include "harness/capture/h5_direct.h"
#include "harness/capture/read_guard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>

#include "harness/core/error.h"

namespace dc {

DirectDataset::~DirectDataset() {
  if (fd >= 0) ::close(fd);
}

using namespace direct;


H5Data::~H5Data() {
  open_.clear();
  index_.clear();
  forget_closed_windows();
}

std::shared_ptr<H5Data> H5Data::run_file(std::string path) {
  std::shared_ptr<H5Data> d(new H5Data());
  d->run_path_ = std::move(path);
  return d;
}

std::shared_ptr<H5Data> H5Data::rank_files(std::vector<std::string> files) {
  std::shared_ptr<H5Data> d(new H5Data());
  d->rank_files_ = std::move(files);
  return d;
}

std::size_t H5Data::add_tap(const std::string& dataset) {
  taps_.push_back(dataset);
  references_.emplace_back();
  streams_.emplace_back();
  return taps_.size() - 1;
}

std::size_t H5Data::add_stream(std::size_t base, std::size_t dim, std::size_t piece_offset,
                               std::size_t reference_offset) {
  taps_.push_back(taps_.at(base));
  references_.push_back(references_.at(base));
  streams_.push_back(Stream{dim, piece_offset, reference_offset});
  return taps_.size() - 1;
}

Slab H5Data::placed(const TapData& t, const Slab& slab, bool reference) const {
  const auto& s = streams_.at(t.data_id);
  if (!s) return slab;
  Slab moved = slab;
  moved.start.at(s->dim) += reference ? s->reference_offset : s->piece_offset;
  return moved;
}

void H5Data::set_reference(std::size_t data_id, const std::string& file,
                           const std::string& dataset) {
  references_.at(data_id) = std::make_pair(file, dataset);
}

const H5Data::Open& H5Data::dataset(const std::string& file, const std::string& path) const {
  std::string key = file + '\n' + path;
  if (auto it = index_.find(key); it != index_.end()) {
    open_.splice(open_.begin(), open_, it->second);
    return it->second->second;
  }
  // The dataset keeps its file open after the file handle closes (HDF5's
  // default weak close), so only datasets are cached.
  h5::Handle f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!f.valid()) input_error("{}: cannot open HDF5 file: {}", file, h5::last_error());
  Open o{h5::Handle(H5Dopen2(f.get(), path.c_str(), H5P_DEFAULT)), nullptr};
  if (!o.ds.valid()) input_error("{}:{}: cannot open dataset: {}", file, path, h5::last_error());
  o.direct = direct_access(o.ds.get(), file);
  if (open_.size() >= kOpenDatasets) {
    index_.erase(open_.back().first);
    open_.pop_back();
  }
  open_.emplace_front(key, std::move(o));
  index_[key] = open_.begin();
  return open_.front().second;
}

namespace {

// The box of a dataset that a slab of a tap is: with the rank row in front
// for a run file (`leading` >= 0).
std::pair<std::vector<hsize_t>, std::vector<hsize_t>> dataset_box(long long leading, const Slab& slab) {
  std::vector<hsize_t> start, count;
  if (leading >= 0) {
    start.push_back(static_cast<hsize_t>(leading));
    count.push_back(1);
  }
  start.insert(start.end(), slab.start.begin(), slab.start.end());
  count.insert(count.end(), slab.count.begin(), slab.count.end());
  return {std::move(start), std::move(count)};
}

}  // namespace

StoredSpan H5Data::read_stored(const Location& at, const Slab& slab, void* out) const {
  std::unique_lock<std::mutex> lock(mu_);
  std::shared_ptr<const DirectDataset> direct;
  {
    h5::ReadGuard guard(at.what + ": reading values");
    direct = dataset(at.file, at.dataset).direct;  // keeps the descriptor alive past an eviction
  }
  if (!direct) return {};
  lock.unlock();
  const auto [start, count] = dataset_box(at.leading, slab);
  const std::size_t n = numel(slab.count);
  if (direct->mappable && n != 0)
    if (const auto first = one_run(*direct, start, count); first && *first + n <= direct->elements)
      if (auto w = window_for(direct, *first, n))
        return {w->values + (*first - w->first) * direct->element_size, direct->element_size, std::move(w)};
  read_direct(*direct, start, count, out, false, at.what);
  return {out, direct->element_size, nullptr};
}

void H5Data::read(const Location& at, const Slab& slab, double* out) const {
  const auto [start, count] = dataset_box(at.leading, slab);
  const std::string& what = at.what;
  std::unique_lock<std::mutex> lock(mu_);
  h5::ReadGuard guard(what + ": reading values");
  const Open& o = dataset(at.file, at.dataset);
  if (auto direct = o.direct) {  // keeps the descriptor alive past an eviction
    lock.unlock();
    read_direct(*direct, start, count, out, true, what);
    return;
  }
  hid_t ds = o.ds.get();
  h5::Handle space(H5Dget_space(ds));
  hsize_t n = numel(slab.count);
  h5::Handle mem(H5Screate_simple(1, &n, nullptr));
  // A scalar dataspace (0-d tap in a rank file) takes no hyperslab.
  bool scalar = H5Sget_simple_extent_type(space.get()) == H5S_SCALAR;
  if (!scalar && H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                     count.data(), nullptr) < 0)
    input_error("{}: cannot select elements: {}", what, h5::last_error());
  if (H5Dread(ds, H5T_NATIVE_DOUBLE, mem.get(), scalar ? H5S_ALL : space.get(), H5P_DEFAULT,
              out) < 0)
    input_error("{}: cannot read data: {}", what, h5::last_error());
}

H5Data::Location H5Data::piece_location(const TapData& t, int rank) const {
  const std::string& path = taps_.at(t.data_id);
  const std::string& file = run_path_.empty() ? rank_files_.at(static_cast<std::size_t>(rank)) : run_path_;
  return {file, path, run_path_.empty() ? -1 : rank, file + ": tap '" + t.name + "'"};
}

H5Data::Location H5Data::reference_location(const TapData& t) const {
  const auto& ref = references_.at(t.data_id);
  if (!ref) fail("tap '{}' has no reference", t.name);
  return {ref->first, ref->second, -1, ref->first + ":" + ref->second};
}

void H5Data::read_piece(const TapData& t, int rank, const Slab& slab, double* out) const {
  read(piece_location(t, rank), placed(t, slab, false), out);
}

StoredSpan H5Data::read_piece_stored(const TapData& t, int rank, const Slab& slab, void* out) const {
  return read_stored(piece_location(t, rank), placed(t, slab, false), out);
}

void H5Data::read_reference(const TapData& t, const Slab& slab, double* out) const {
  read(reference_location(t), placed(t, slab, true), out);
}

StoredSpan H5Data::read_reference_stored(const TapData& t, const Slab& slab, void* out) const {
  return read_stored(reference_location(t), placed(t, slab, true), out);
}

}  // namespace dc
