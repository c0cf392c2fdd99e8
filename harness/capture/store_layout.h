// What the run-file writers share (store_write.cpp: parallel HDF5 and
// gathered; store_positional.cpp: laid out by rank 0, written by every rank
// at its offsets). Private to store.
#pragma once
#include <cstddef>
#include <functional>
#include <map>
#include <string>

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

// WriteMode::positional. Collective over `world`; ends alike on every rank:
// returns when every rank's rows and boxes are in `tmp`, else throws on every
// rank (`tmp` removed).
void write_positional(const Comm& world, const std::string& tmp, const std::string& path, const RunInfo& info,
                      const TapRecorder& taps, const std::map<std::string, ReferenceEntry>& manifest,
                      const std::function<void()>& created);

}  // namespace dc
