// Streams tap values out of activation files (either form) for the
// comparator: hyperslab reads converted to float64, one at a time (HDF5 is not
// thread-safe), with the datasets kept open in a small LRU cache so that a
// walk over many ranks' files neither reopens a file per chunk nor holds
// thousands of files open. Private to store.
#pragma once
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "harness/capture/activations.h"
#include "harness/capture/h5util.h"

namespace dc {

// A dataset whose bytes can be read straight from the file: contiguous
// layout, no filters, native little-endian float32/float64. Reads of it skip
// HDF5 (and its lock), so threads read in parallel.
struct DirectDataset {
  int fd = -1;
  long long offset = 0;  // of element 0 in the file
  std::size_t element_size = 0;
  Shape dims;
  std::string file;
  // A large dataset whose bytes the file holds whole is read through
  // mappings of it (h5_data.cpp, "Windows"): a slab that is one run of it is
  // scanned where it lies in the page cache, not copied out by pread (a
  // third of a 256 MiB pair's check went to that copy).
  bool mappable = false;
  std::size_t elements = 0;
  ~DirectDataset();
};

class H5Data final : public ActivationData {
 public:
  // Run file: `path`, tap datasets [world, *local]. Rank files: `rank_files[r]`,
  // tap datasets [*local].
  static std::shared_ptr<H5Data> run_file(std::string path);
  static std::shared_ptr<H5Data> rank_files(std::vector<std::string> files);
  ~H5Data() override;

  // Registers a tap (its dataset path below the root); returns its data_id.
  std::size_t add_tap(const std::string& dataset);
  void set_reference(std::size_t data_id, const std::string& file, const std::string& dataset);
  // A tap that is one stream of tap `base` (docs/FORMAT.md, `streams`): the
  // same datasets, its pieces from `piece_offset` and its reference from
  // `reference_offset` along dimension `dim`. Returns its data_id.
  std::size_t add_stream(std::size_t base, std::size_t dim, std::size_t piece_offset, std::size_t reference_offset);

  void read_piece(const TapData& t, int rank, const Slab& slab, double* out) const override;
  void read_reference(const TapData& t, const Slab& slab, double* out) const override;
  StoredSpan read_piece_stored(const TapData& t, int rank, const Slab& slab, void* out) const override;
  StoredSpan read_reference_stored(const TapData& t, const Slab& slab, void* out) const override;

 private:
  H5Data() = default;
  // Where a piece or a reference lies: `leading` is the rank row of a run
  // file's dataset, -1 for none; `what` names it in errors.
  struct Location {
    const std::string& file;
    const std::string& dataset;
    long long leading;
    std::string what;
  };
  Location piece_location(const TapData& t, int rank) const;
  Location reference_location(const TapData& t) const;
  void read(const Location& at, const Slab& slab, double* out) const;
  // As read(), but the values as stored when the dataset is direct (in `out`,
  // or in a window mapping the dataset); element_size 0 (and nothing read) otherwise.
  StoredSpan read_stored(const Location& at, const Slab& slab, void* out) const;
  struct Open {
    h5::Handle ds;
    std::shared_ptr<const DirectDataset> direct;  // null: read through HDF5
  };
  const Open& dataset(const std::string& file, const std::string& path) const;  // caller holds mu_

  std::string run_path_;
  std::vector<std::string> rank_files_;
  std::vector<std::string> taps_;
  std::vector<std::optional<std::pair<std::string, std::string>>> references_;
  struct Stream {
    std::size_t dim = 0, piece_offset = 0, reference_offset = 0;
  };
  std::vector<std::optional<Stream>> streams_;  // per data_id: a stream of another tap's datasets
  // `slab` of a stream moved to where the stream lies in its datasets (pieces or reference).
  Slab placed(const TapData& t, const Slab& slab, bool reference) const;

  static constexpr std::size_t kOpenDatasets = 256;
  mutable std::mutex mu_;
  mutable std::list<std::pair<std::string, Open>> open_;  // most recent first
  mutable std::unordered_map<std::string, std::list<std::pair<std::string, Open>>::iterator> index_;
};

}  // namespace dc
