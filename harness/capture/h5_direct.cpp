// Direct reads of contiguous datasets (capture/h5_direct.h).
#include "harness/capture/h5_direct.h"

#include <fcntl.h>
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

#include "harness/core/error.h"

namespace dc::direct {

void may_map(DirectDataset& d);

// The direct-read description of `ds`, or null when HDF5 must do the reading.
std::shared_ptr<const DirectDataset> direct_access(hid_t ds, const std::string& file) {
  h5::Handle dcpl(H5Dget_create_plist(ds));
  if (H5Pget_layout(dcpl.get()) != H5D_CONTIGUOUS || H5Pget_nfilters(dcpl.get()) != 0 ||
      H5Pget_external_count(dcpl.get()) != 0)
    return nullptr;
  h5::Handle type(H5Dget_type(ds));
  std::size_t size = 0;
  if (H5Tequal(type.get(), H5T_NATIVE_FLOAT) > 0) size = 4;
  if (H5Tequal(type.get(), H5T_NATIVE_DOUBLE) > 0) size = 8;
  haddr_t offset = H5Dget_offset(ds);
  if (size == 0 || offset == HADDR_UNDEF) return nullptr;
  h5::Handle space(H5Dget_space(ds));
  int nd = H5Sget_simple_extent_ndims(space.get());
  if (nd < 0) return nullptr;
  std::vector<hsize_t> dims(static_cast<std::size_t>(nd));
  if (nd > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  auto d = std::make_shared<DirectDataset>();
  d->fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (d->fd < 0) return nullptr;
  d->offset = static_cast<long long>(offset);
  d->element_size = size;
  d->dims.assign(dims.begin(), dims.end());
  d->file = file;
  may_map(*d);
  return d;
}

// Windows. A dataset of at least kMapMinBytes whose bytes the file holds
// whole (one that ends early keeps pread, whose error says so; a mapping of
// missing bytes faults) is read through read-only mappings of kWindowBytes
// of it, shared by the threads (each faults in pages the other reads next)
// and kept for the next reads, kWindows of them for the whole process: the
// scans read the page cache where it lies, and what the process maps stays
// bounded, about (kWindows + 2 per thread) x kWindowBytes (a whole 4 GB run
// file mapped would count in its RSS). A file cut short while being read
// faults (SIGBUS) on the pages it lost: the read guard makes that an input
// error naming the file (GuardedMapping). Smaller datasets are not worth mappings.
constexpr std::size_t kMapMinBytes = std::size_t{1} << 20;
constexpr std::size_t kWindowBytes = std::size_t{16} << 20;
constexpr std::size_t kWindows = 4;

void may_map(DirectDataset& d) {
  std::size_t n = 1;
  for (auto x : d.dims) {
    if (x != 0 && n > (std::size_t{1} << 50) / x) return;  // beyond any file
    n *= x;
  }
  const std::size_t bytes = n * d.element_size;
  struct stat st {};
  if (bytes < kMapMinBytes || d.offset < 0 || ::fstat(d.fd, &st) != 0 ||
      static_cast<unsigned long long>(st.st_size) < static_cast<unsigned long long>(d.offset) + bytes)
    return;
  d.mappable = true;
  d.elements = n;
}

std::shared_ptr<const Window> map_window(const std::shared_ptr<const DirectDataset>& d, std::size_t first,
                                         std::size_t count) {
  static const long page = ::sysconf(_SC_PAGESIZE);
  const long long at = d->offset + static_cast<long long>(first * d->element_size);
  const long long start = at / page * page;
  const std::size_t lead = static_cast<std::size_t>(at - start), bytes = lead + count * d->element_size;
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, d->fd, static_cast<off_t>(start));
  if (p == MAP_FAILED) return nullptr;
  auto w = std::make_shared<Window>();
  w->of = d;
  w->first = first;
  w->count = count;
  w->base = p;
  w->bytes = bytes;
  w->values = static_cast<const char*>(p) + lead;
  w->guard = std::make_unique<h5::GuardedMapping>(p, bytes, d->file);
  return w;
}

// The process's most recently used windows, first the latest.
struct Windows {
  std::mutex mu;
  std::array<std::shared_ptr<const Window>, kWindows> recent;
};
Windows& windows() {
  static Windows* w = new Windows();  // never destroyed: worker threads may outlive statics
  return *w;
}

// A window that holds [first, first + n) of `d`, mapping one (in the least
// recently used one's place) when none does; null when the mapping fails
// (the caller reads with pread).
std::shared_ptr<const Window> window_for(const std::shared_ptr<const DirectDataset>& d, std::size_t first,
                                         std::size_t n) {
  Windows& all = windows();
  {
    std::lock_guard<std::mutex> lock(all.mu);
    for (std::size_t i = 0; i < all.recent.size(); ++i) {
      const auto& w = all.recent[i];
      if (w && first >= w->first && first + n <= w->first + w->count && w->of.lock() == d) {
        std::rotate(all.recent.begin(), all.recent.begin() + static_cast<long>(i),
                    all.recent.begin() + static_cast<long>(i) + 1);
        return all.recent.front();
      }
    }
  }
  // The aligned window around `first`, or the run itself when it crosses one.
  // Mapped outside the lock: two threads may map the same window at once,
  // and both mappings serve.
  const std::size_t per = std::max<std::size_t>(1, kWindowBytes / d->element_size);
  std::size_t wfirst = first / per * per, wcount = std::min(per, d->elements - wfirst);
  if (first + n > wfirst + wcount) wfirst = first, wcount = n;
  auto w = map_window(d, wfirst, wcount);
  if (!w) return nullptr;
  std::shared_ptr<const Window> evicted;  // unmapped after the lock is released
  std::lock_guard<std::mutex> lock(all.mu);
  std::rotate(all.recent.begin(), all.recent.end() - 1, all.recent.end());
  evicted = std::move(all.recent.front());
  all.recent.front() = w;
  return w;
}

// Drops the kept windows of datasets no longer open (their mappings would
// hold deleted files' blocks and count in the RSS until evicted).
void forget_closed_windows() {
  Windows& all = windows();
  std::array<std::shared_ptr<const Window>, kWindows> dropped;  // unmapped after the lock
  std::lock_guard<std::mutex> lock(all.mu);
  for (std::size_t i = 0; i < all.recent.size(); ++i)
    if (all.recent[i] && all.recent[i]->of.expired()) dropped[i] = std::move(all.recent[i]);
}

void pread_all(const DirectDataset& d, std::size_t first, std::size_t n, char* into,
               const std::string& what) {
  std::size_t bytes = n * d.element_size;
  off_t at = static_cast<off_t>(d.offset + static_cast<long long>(first * d.element_size));
  while (bytes > 0) {
    ssize_t got = ::pread(d.fd, into, bytes, at);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      input_error("{}: cannot read {} bytes at offset {}: {}", what, bytes, at,
                  got < 0 ? std::strerror(errno) : "the file ends early (truncated?)");
    bytes -= static_cast<std::size_t>(got);
    at += got;
    into += got;
  }
}

// Copies n elements from element `first` of the dataset into `to` as float64
// (float32 through a per-thread staging buffer, then widened).
void read_run(const DirectDataset& d, std::size_t first, std::size_t n, double* to,
              const std::string& what) {
  if (d.element_size == 8) return pread_all(d, first, n, reinterpret_cast<char*>(to), what);
  thread_local std::vector<float> staging;
  if (staging.size() < n) staging.resize(n);
  pread_all(d, first, n, reinterpret_cast<char*>(staging.data()), what);
  const float* f = staging.data();
  // Four at a time (two cvtps2pd): at -O2 the plain loop stays scalar, a
  // conversion and a store per element, and GCC's generic vectors lower
  // this conversion to scalar ones too.
  std::size_t i = 0;
#if defined(__SSE2__)
  for (; i + 4 <= n; i += 4) {
    const __m128 v = _mm_loadu_ps(f + i);
    _mm_storeu_pd(to + i, _mm_cvtps_pd(v));
    _mm_storeu_pd(to + i + 2, _mm_cvtps_pd(_mm_movehl_ps(v, v)));
  }
#endif
  for (; i < n; ++i) to[i] = static_cast<double>(f[i]);
}

// Reads the box (start, count) of a direct dataset into `out`, one contiguous
// run at a time: as float64 (`widen`) or as stored.
// The contiguous runs a box (start, count) of the dataset is made of: their
// length (the trailing dimensions the box covers whole, times the next one's
// count) and how many leading dimensions an odometer walks to visit them.
struct BoxRuns {
  std::size_t run, leading;
};
BoxRuns box_runs(const DirectDataset& d, const std::vector<hsize_t>& start, const std::vector<hsize_t>& count) {
  std::size_t run = 1, k = d.dims.size();
  while (k > 0 && start[k - 1] == 0 && count[k - 1] == d.dims[k - 1]) run *= d.dims[--k];
  if (k > 0) run *= count[--k];
  return {run, k};
}

void read_direct(const DirectDataset& d, const std::vector<hsize_t>& start,
                 const std::vector<hsize_t>& count, void* out, bool widen, const std::string& what) {
  const std::size_t nd = d.dims.size();
  std::size_t n = 1;
  for (auto c : count) n *= c;
  if (n == 0) return;
  const auto [run, k] = box_runs(d, start, count);
  std::vector<std::size_t> stride(nd, 1);
  for (std::size_t i = nd; i-- > 1;) stride[i - 1] = stride[i] * d.dims[i];
  std::vector<hsize_t> idx(k, 0);  // odometer over dimensions [0, k)
  for (std::size_t done = 0; done < n; done += run) {
    std::size_t first = 0;
    for (std::size_t i = 0; i < nd; ++i) first += (start[i] + (i < k ? idx[i] : 0)) * stride[i];
    if (widen)
      read_run(d, first, run, static_cast<double*>(out) + done, what);
    else
      pread_all(d, first, run, static_cast<char*>(out) + done * d.element_size, what);
    for (std::size_t i = k; i-- > 0;) {
      if (++idx[i] < count[i]) break;
      idx[i] = 0;
    }
  }
}

// The first element of the box (start, count) when the box is one
// contiguous run of the dataset (a chunk of whole rows, say); none otherwise.
std::optional<std::size_t> one_run(const DirectDataset& d, const std::vector<hsize_t>& start,
                                   const std::vector<hsize_t>& count) {
  std::size_t n = 1;
  for (auto c : count) n *= c;
  if (box_runs(d, start, count).run != n) return std::nullopt;
  std::size_t first = 0, stride = 1;
  for (std::size_t i = d.dims.size(); i-- > 0;) {
    first += start[i] * stride;
    stride *= d.dims[i];
  }
  return first;
}

}  // namespace dc::direct
