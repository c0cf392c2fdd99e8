// What the run-file writers share (store_write.cpp: parallel HDF5 and
// gathered; store_positional.cpp: laid out by rank 0, written by every rank
// at its offsets). Private to store.
#pragma once
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "harness/capture/h5util.h"
#include "harness/capture/store.h"

namespace dc {

// One reference as every rank declared it: agreed before the file exists.
struct ReferenceEntry {
  Shape shape;
  std::size_t elements = 0;    // held by all ranks together
  std::size_t max_blocks = 0;  // the most boxes one rank holds: collective writes per reference
  int first_rank = -1;         // who declared the shape first, for messages
};

// A dataset (intermediate groups made), or an Error naming it.
h5::Handle create_dataset(hid_t file, const std::string& path, hid_t type, const Shape& dims, int rank,
                          hid_t dcpl = H5P_DEFAULT);
// A tap's dataset [world, *local] with its attributes.
h5::Handle create_tap(hid_t file, const TapRecord& r, const TapRecorder& taps, int world, int rank,
                      hid_t dcpl = H5P_DEFAULT);
// The root attributes and the /taps group; `where` names the file in errors.
h5::Handle write_run_file_header(hid_t file, const std::string& where, const RunInfo& info, const TapRecorder& taps,
                                 int world_size, int rank);
// A new run file's creation properties (links kept in creation order).
h5::Handle run_file_creation_props();

// WriteMode::gathered (store_gathered.cpp): the ranks other than 0 send
// their rows and boxes in order; rank 0 creates every dataset in `file` and
// writes its own and the others' as they arrive (`boxes`: where every rank's
// reference boxes are).
void send_rows_and_boxes(const Comm& world, const TapRecorder& taps,
                         const std::map<std::string, ReferenceEntry>& manifest);
void receive_and_write(hid_t file, const Comm& world, const TapRecorder& taps,
                       const std::map<std::string, ReferenceEntry>& manifest,
                       const std::map<std::string, std::vector<HeldBox>>& boxes);

// What a PositionalWrites lays out and writes: the whole file; its header
// and taps only (begun before the references exist: begin_run_file); or the
// references, added to a file whose taps part was laid out before.
enum class PositionalPart { all, taps, references };

// WriteMode::positional (store_positional.cpp). The constructor is
// collective: rank 0 lays `tmp` out, every rank learns the offsets, runs
// `created`, and starts a thread writing its own rows and boxes. wait() is
// collective: every rank's writes are done, or every rank throws (`tmp`
// removed, the message names `path`).
class PositionalWrites {
 public:
  PositionalWrites(const Comm& world, const std::string& tmp, const RunInfo& info, const TapRecorder& taps,
                   const std::map<std::string, ReferenceEntry>& manifest, const std::function<void()>& created,
                   PositionalPart part = PositionalPart::all);
  ~PositionalWrites();  // joins the thread
  PositionalWrites(const PositionalWrites&) = delete;
  PositionalWrites& operator=(const PositionalWrites&) = delete;
  void wait(const std::string& path);
  double seconds() const { return seconds_; }  // the thread's, once waited for

 private:
  void join();
  const Comm& world_;
  std::string tmp_;
  std::map<std::string, ReferenceEntry> manifest_;  // the thread's own copy
  PositionalPart part_;
  std::thread thread_;
  std::string error_;     // the thread's, or ""
  bool direct_ = false;   // some bytes went out with O_DIRECT
  double seconds_ = 0;
};

}  // namespace dc
