// WriteMode::positional: rank 0 lays the run file out with serial HDF5
// (every dataset contiguous, allocated at creation, never filled, and at a
// 4 KiB-aligned address), every rank learns each dataset's file offset, and
// each writes its own tap rows and reference boxes there with pwrite — the
// whole pages through O_DIRECT where the filesystem takes it.
//
// Why: on the 2-core VM diffcheck is measured on, writing through the page
// cache runs at 0.4-0.6 GB/s (4 processes writing 4.5 GB: 8.9-11.0 s), where
// O_DIRECT writes of the same bytes take 2.2-2.4 s (2.0-2.2 GB/s). Fresh
// page-cache pages must be zeroed and backed by the host (the balloon's free
// page reporting hands freed memory back to it), and past about 3 GB dirty
// the kernel throttles every writer to the disk's pace anyway. MPI-IO writes
// through the page cache as well. Only for ranks on one host: two hosts
// writing the bytes of one page through their own page caches could lose one
// another's (the caller keeps MPI-IO there).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>

#include "harness/capture/store_layout.h"
#include "harness/core/agree.h"
#include "harness/core/error.h"

namespace dc {
namespace {

using h5::Handle;

constexpr std::uint64_t kPage = 4096;             // O_DIRECT's alignment of offsets, lengths and memory
constexpr std::size_t kBounceBytes = std::size_t{8} << 20;  // staged per direct write

std::uint64_t round_down(std::uint64_t x) { return x / kPage * kPage; }
std::uint64_t round_up(std::uint64_t x) { return (x + kPage - 1) / kPage * kPage; }

// Appends byte ranges at file offsets; contiguous ranges are staged in one
// page-aligned buffer, whose whole pages go out with O_DIRECT and whose
// partial first and last pages (shared with another rank's bytes) through
// the page cache. Errors throw, naming the file.
class PositionalWriter {
 public:
  PositionalWriter(const std::string& file, int rank) : file_(file), rank_(rank) {
    fd_ = ::open(file.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd_ < 0) fail("rank {}: cannot open run file '{}' to write its rows: {}", rank, file, std::strerror(errno));
    // Filesystems that refuse O_DIRECT (tmpfs before Linux 6.6, some network ones): all through the page cache.
    if (const char* v = std::getenv("DIFFCHECK_DIRECT_IO"); !(v && std::string(v) == "0"))
      direct_fd_ = ::open(file.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);
    void* p = nullptr;
    if (posix_memalign(&p, kPage, kBounceBytes) != 0) fail("rank {}: no memory for the run file's write buffer", rank);
    buf_.reset(static_cast<char*>(p));
  }
  ~PositionalWriter() {
    if (fd_ >= 0) ::close(fd_);
    if (direct_fd_ >= 0) ::close(direct_fd_);
  }
  PositionalWriter(const PositionalWriter&) = delete;
  PositionalWriter& operator=(const PositionalWriter&) = delete;

  void put(std::uint64_t offset, const void* data, std::size_t n) {
    if (n == 0) return;
    if (end_ > begin_ && offset != base_ + end_) drain(true);
    if (end_ == begin_) {
      base_ = round_down(offset);
      begin_ = end_ = static_cast<std::size_t>(offset - base_);
    }
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const std::size_t k = std::min(n, kBounceBytes - end_);
      std::memcpy(buf_.get() + end_, p, k);
      end_ += k, p += k, n -= k;
      if (end_ == kBounceBytes) drain(false);
    }
  }

  // Everything staged goes out; then the file is closed (its errors count).
  void finish() {
    drain(true);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("rank {}: closing run file '{}' failed: {}", rank_, file_, std::strerror(errno));
  }

  bool direct_used() const { return direct_bytes_ > 0; }

 private:
  // Writes buf_[begin_, end_): its whole pages with O_DIRECT, the partial
  // ones at its ends through the page cache. Called with a full buffer
  // (`all` false) only, whose end is a page boundary (base_ and the buffer's
  // size are whole pages), the bytes that follow continue on the next page.
  void drain(bool all) {
    const std::size_t whole_begin = round_up(begin_), whole_end = round_down(end_);
    if (whole_begin >= whole_end) {
      write_cached(begin_, end_);
    } else {
      write_cached(begin_, whole_begin);
      write_direct(whole_begin, whole_end);
      write_cached(whole_end, end_);
    }
    if (!all) base_ += end_;
    begin_ = end_ = 0;
  }

  void write_direct(std::size_t from, std::size_t to) {
    if (direct_fd_ >= 0 && write_all(direct_fd_, from, to, /*may_refuse=*/true)) {
      direct_bytes_ += to - from;
      return;
    }
    write_cached(from, to);
  }
  void write_cached(std::size_t from, std::size_t to) { write_all(fd_, from, to, false); }

  // False only when O_DIRECT is refused (EINVAL: alignment the device wants
  // larger than a page): from then on, this rank writes through the cache.
  bool write_all(int fd, std::size_t from, std::size_t to, bool may_refuse) {
    while (from < to) {
      const ssize_t w = ::pwrite(fd, buf_.get() + from, to - from, static_cast<off_t>(base_ + from));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && may_refuse && errno == EINVAL) {
        ::close(direct_fd_);
        direct_fd_ = -1;
        return false;
      }
      if (w <= 0)
        fail("rank {}: writing {} bytes at offset {} of run file '{}' failed: {}", rank_, to - from, base_ + from,
             file_, w < 0 ? std::strerror(errno) : "nothing written");
      from += static_cast<std::size_t>(w);
    }
    return true;
  }

  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::string file_;
  int rank_;
  int fd_ = -1, direct_fd_ = -1;
  std::unique_ptr<char, Free> buf_;
  std::uint64_t base_ = 0;           // file offset of buf_[0], a multiple of kPage
  std::size_t begin_ = 0, end_ = 0;  // staged bytes: buf_[begin_, end_)
  std::uint64_t direct_bytes_ = 0;
};

// Rank 0: the file with its attributes and every dataset of `part`
// allocated; returns those datasets' file offsets, taps (in record order)
// then references (in manifest order), one per line ("-" for an empty
// dataset, which has none). PositionalPart::references reopens the file the
// taps part made, to add the references after it.
std::string lay_out(const std::string& tmp, const RunInfo& info, const TapRecorder& taps, int world_size,
                    const std::map<std::string, ReferenceEntry>& manifest, PositionalPart part) {
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_alignment(fapl.get(), kPage, kPage);  // objects of a page or more start on a page
  Handle file, taps_group;
  if (part == PositionalPart::references) {
    file = Handle(H5Fopen(tmp.c_str(), H5F_ACC_RDWR, fapl.get()));
    if (!file.valid()) fail("rank 0: HDF5 cannot reopen run file '{}' to add its references: {}", tmp, h5::last_error());
  } else {
    Handle fcpl = run_file_creation_props();
    file = Handle(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()));
    if (!file.valid()) fail("rank 0: HDF5 cannot create run file '{}': {}", tmp, h5::last_error());
    taps_group = write_run_file_header(file.get(), tmp, info, taps, world_size, 0);
  }
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);
  H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
  std::string offsets;
  auto note = [&](const Handle& ds, const std::string& what) {
    const haddr_t a = H5Dget_offset(ds.get());
    if (a == HADDR_UNDEF && H5Dget_storage_size(ds.get()) > 0)
      fail("rank 0: HDF5 gives no file offset for '{}' in '{}'", what, tmp);
    offsets += a == HADDR_UNDEF ? "-\n" : std::to_string(a) + "\n";
  };
  if (part != PositionalPart::references)
    for (const auto& r : taps.records()) note(create_tap(file.get(), r, taps, world_size, 0, dcpl.get()), r.name);
  if (part != PositionalPart::taps)
    for (const auto& [name, entry] : manifest)
      note(create_dataset(file.get(), "/reference/" + name, H5T_IEEE_F64LE, entry.shape, 0, dcpl.get()), name);
  taps_group.reset();
  if (H5Fclose(file.release()) < 0) fail("rank 0: HDF5 cannot close run file '{}': {}", tmp, h5::last_error());
  return offsets;
}

std::vector<std::uint64_t> parse_offsets(const std::string& text) {
  std::vector<std::uint64_t> out;
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) out.push_back(line == "-" ? 0 : std::stoull(line));
  return out;
}

// A box of a row-major array of `global` shape, as the runs of consecutive
// elements it covers: f(first element's index in the array, index in the
// box's own data, elements).
template <class F>
void for_each_run(const Shape& global, const std::vector<std::size_t>& start, const Shape& count, F&& f) {
  const std::size_t d = global.size();
  if (d == 0) return f(std::size_t{0}, std::size_t{0}, std::size_t{1});
  for (auto c : count)
    if (c == 0) return;
  // The runs are as long as the innermost dimensions the box covers whole,
  // times its extent in the next one out.
  std::size_t k = d - 1, run = count[k];
  while (k > 0 && count[k] == global[k]) run *= count[--k];
  std::vector<std::size_t> stride(d, 1);
  for (std::size_t i = d - 1; i > 0; --i) stride[i - 1] = stride[i] * global[i];
  std::vector<std::size_t> at(k, 0);  // position in the box's outer dimensions [0, k)
  for (std::size_t done = 0;; done += run) {
    std::size_t index = start[k] * stride[k];
    for (std::size_t i = 0; i < k; ++i) index += (start[i] + at[i]) * stride[i];
    f(index, done, run);
    std::size_t i = k;
    while (i > 0 && ++at[i - 1] == count[i - 1]) at[--i] = 0;
    if (i == 0) return;
  }
}

// This rank's rows and boxes of `part` into `tmp`, at the offsets rank 0
// laid out. True when some went out with O_DIRECT.
bool write_my_pieces(const std::string& tmp, const TapRecorder& taps, int rank,
                     const std::map<std::string, ReferenceEntry>& manifest, const std::vector<std::uint64_t>& offsets,
                     PositionalPart part) {
  PositionalWriter out(tmp, rank);
  std::size_t i = 0;
  if (part != PositionalPart::references)
    for (const auto& r : taps.records()) {
      const std::size_t row = r.local.size() * sizeof(float);
      out.put(offsets[i++] + static_cast<std::uint64_t>(rank) * row, r.local.ptr(), row);
    }
  if (part != PositionalPart::taps)
    for (const auto& [name, entry] : manifest) {
      const std::uint64_t base = offsets[i++];
      const auto it = taps.references().find(name);
      if (it == taps.references().end()) continue;
      for (const auto& b : it->second.blocks)
        for_each_run(entry.shape, b.start, b.data.shape, [&](std::size_t index, std::size_t from, std::size_t n) {
          out.put(base + index * sizeof(double), b.data.ptr() + from, n * sizeof(double));
        });
    }
  out.finish();
  return out.direct_used();
}

void remove_file(const std::string& file) {
  std::error_code ec;
  std::filesystem::remove(file, ec);
}

}  // namespace

PositionalWrites::PositionalWrites(const Comm& world, const std::string& tmp, const RunInfo& info,
                                   const TapRecorder& taps, const std::map<std::string, ReferenceEntry>& manifest,
                                   const std::function<void()>& created, PositionalPart part)
    : world_(world), tmp_(tmp), manifest_(manifest), part_(part) {
  const int rank = world.rank();
  std::vector<std::uint64_t> offsets;
  try {
    offsets = parse_offsets(
        agreed_on_root(world, 0, [&] { return lay_out(tmp, info, taps, world.size(), manifest, part); }));
  } catch (const std::exception& e) {
    if (rank == 0) remove_file(tmp);
    throw;
  }
  if (created) created();
  thread_ = std::thread([this, &taps, rank, part, offsets = std::move(offsets)] {
    // Beside the references (which keep every core busy) the taps' writer
    // takes what CPU they leave: its copies and system calls would otherwise
    // come out of theirs. (On Linux a thread has a nice value of its own.)
    if (part == PositionalPart::taps) ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      direct_ = write_my_pieces(tmp_, taps, rank, manifest_, offsets, part);
    } catch (const std::exception& e) {
      error_ = e.what();
    }
    seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
}

PositionalWrites::~PositionalWrites() { join(); }

void PositionalWrites::join() {
  if (thread_.joinable()) thread_.join();
}

void PositionalWrites::wait(const std::string& path) {
  std::vector<std::string> direct;
  try {
    direct = agreed_on_all(world_, [&] {
      join();
      if (!error_.empty()) throw Error(error_);
      return std::string(direct_ ? "1" : "0");
    });
  } catch (const std::exception& e) {
    if (world_.rank() == 0) remove_file(tmp_);
    const std::string what = fmt::format("{}; nothing was written to '{}'", e.what(), path);
    if (dynamic_cast<const AgreedError*>(&e)) throw AgreedError(what);  // keeps the clean end (main)
    throw Error(what);
  }
  if (world_.rank() == 0)
    spdlog::info("run file{} written at each rank's offsets; {} of {} ranks past the page cache (O_DIRECT)",
                 part_ == PositionalPart::taps         ? "'s taps"
                 : part_ == PositionalPart::references ? "'s references"
                                                       : "",
                 std::count(direct.begin(), direct.end(), "1"), world_.size());
}

}  // namespace dc
