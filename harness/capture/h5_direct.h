// Reading a contiguous, uncompressed dataset without HDF5: its bytes at
// their offset in the file, mapped (a few windows kept for the whole
// process) or read with pread, widened to double where asked. The fast path
// of H5Data (capture/h5_data.cpp); internal to capture/.
#pragma once
#include <hdf5.h>
#include <sys/mman.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/capture/h5_data.h"
#include "harness/capture/read_guard.h"

namespace dc::direct {

// Elements [first, first + count) of a dataset, mapped.
struct Window {
  std::weak_ptr<const DirectDataset> of;
  std::size_t first = 0, count = 0;
  void* base = nullptr;
  std::size_t bytes = 0;
  const char* values = nullptr;  // element `first`
  std::unique_ptr<h5::GuardedMapping> guard;  // a read past a cut file: exit 2, naming it
  ~Window() {
    guard.reset();
    if (base) ::munmap(base, bytes);
  }
};

// The direct-read description of `ds`, or null when HDF5 must do the reading.
std::shared_ptr<const DirectDataset> direct_access(hid_t ds, const std::string& file);
// A window that holds [first, first + n) of `d`, mapping one (in the least
// recently used one's place) when none does; null when the mapping fails
// (the caller reads with pread).
std::shared_ptr<const Window> window_for(const std::shared_ptr<const DirectDataset>& d, std::size_t first,
                                         std::size_t n);
// Drops the windows of datasets no longer open.
void forget_closed_windows();
// The box [start, start + count) of `d` into `out`: as stored, or widened to
// double (`widen`).
void read_direct(const DirectDataset& d, const std::vector<hsize_t>& start, const std::vector<hsize_t>& count,
                 void* out, bool widen, const std::string& what);
// The box's first element when it is one run of consecutive elements.
std::optional<std::size_t> one_run(const DirectDataset& d, const std::vector<hsize_t>& start,
                                   const std::vector<hsize_t>& count);

}  // namespace dc::direct
