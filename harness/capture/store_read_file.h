// The pieces of an activation file that store_read.cpp assembles into an
// ActivationSet: the file opened once, its root attributes, its datasets
// (walked safely: hard links only, bounded depth and declared size), and a
// tap's shape, stored kind and attributes. Internal to capture/.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/capture/activations.h"
#include "harness/capture/h5util.h"
#include "harness/core/mesh.h"

namespace dc {
class H5Data;
}

namespace dc::read {

h5::Handle open_file(const std::string& path);

// The files one read_activations() has opened, each opened once: the source
// is looked at, then read as a run file or as rank files, and every one of
// them may hold references. (An open of a 1 MiB file was about 0.3 ms of
// HDF5's work; a compare opened its files up to four times each.)
class OpenFiles {
 public:
  hid_t get(const std::string& path) {
    auto it = open_.find(path);
    if (it == open_.end()) it = open_.emplace(path, open_file(path)).first;
    return it->second.get();
  }

 private:
  std::map<std::string, h5::Handle> open_;
};

struct Root {
  long long schema = 0;
  std::string mesh;
  long long world_size = 0;
  std::optional<long long> rank;
  std::map<std::string, std::string> info;
};

Root read_root(hid_t file, const std::string& path, bool need_mesh);

// Dataset paths below `group`, in creation order when the file tracks it,
// otherwise in name order. Every link must be a hard link (a soft or
// external link could read another file or loop), at most 32 deep.
std::vector<std::string> list_datasets(hid_t file, const char* group, const std::string& path);

// Declared data against the file's size: a small file that declares a huge
// (compressed or unallocated) dataset would take hours or all memory.
class DeclaredBytes {
 public:
  explicit DeclaredBytes(const std::string& path);
  void add(std::uintmax_t bytes, const std::string& where);

 private:
  std::string path_;
  std::uintmax_t file_size_ = 0, declared_ = 0;
};

StoredKind stored_kind(hid_t ds, const std::string& where);
Shape dataset_shape(hid_t ds, const std::string& where, DeclaredBytes& declared);
void read_tap_attrs(hid_t ds, const std::string& where, const Mesh& mesh, TapData& t);

// The `streams` attribute of a tap (store_streams.cpp): parsed and checked
// against its layout and local shape.
void read_streams_attr(hid_t ds, const std::string& where, const Mesh& mesh, TapData& t);
// Each tap with streams replaced, in place, by one tap per stream, reading
// the slices of its datasets (after the references are attached).
// `split_like`: splits to apply to taps without `streams` (read_activations).
void expand_streams(ActivationSet& set, H5Data& data, const std::map<std::string, StreamSplit>* split_like);

}  // namespace dc::read
