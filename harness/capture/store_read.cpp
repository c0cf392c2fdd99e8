// Reader for both file forms: a run file ([world, *local] per tap) or one
// file per rank (`<prefix>.rank<R>.h5`, [*local] per tap).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>

#include "harness/core/error.h"
#include "harness/capture/h5_data.h"
#include "harness/capture/h5util.h"
#include "harness/capture/read_guard.h"
#include "harness/capture/store.h"
#include "harness/capture/tap_order.h"
#include "harness/capture/store_read_file.h"
#include "harness/capture/store_sketch.h"

namespace dc {
namespace {

using h5::Handle;
using namespace read;
namespace fs = std::filesystem;

const std::regex kRankFile(R"((.*)\.rank(0|[1-9][0-9]*)\.h5$)");

std::string rank_file(const std::string& prefix, long long r) {
  return fmt::format("{}.rank{}.h5", prefix, r);
}

void attach_references(ActivationSet& set, H5Data& data, const std::vector<std::string>& files,
                       OpenFiles& open) {
  std::vector<hid_t> handles;
  std::vector<DeclaredBytes> declared;
  for (const auto& f : files) {
    handles.push_back(open.get(f));
    declared.emplace_back(f);
    list_datasets(handles.back(), "/reference", f);  // refuses links out, deep nesting
  }
  for (auto& t : set.taps) {
    for (std::size_t fi = 0; fi < files.size(); ++fi) {
      const std::string& f = files[fi];
      const hid_t file = handles[fi];
      std::string path = "/reference/" + t.name;
      h5::ReadGuard guard(f + ":" + path + ": looking for the reference");
      // H5Lexists fails on a missing intermediate group; walk the path.
      bool exists = true;
      std::string partial;
      for (std::size_t pos = 1; exists;) {
        auto next = path.find('/', pos);
        partial = path.substr(0, next);
        exists = H5Lexists(file, partial.c_str(), H5P_DEFAULT) > 0;
        if (next == std::string::npos) break;
        pos = next + 1;
      }
      H5Eclear2(H5E_DEFAULT);
      if (!exists) continue;
      std::string where = f + ":" + path;
      Handle ds(H5Dopen2(file, path.c_str(), H5P_DEFAULT));
      if (!ds.valid()) input_error("{}: not a dataset", where);
      Shape s = dataset_shape(ds.get(), where, declared[fi]);
      Shape global = t.layout.global_shape(set.mesh, t.local_shape);
      if (h5::read_string_attr(ds.get(), "sketch", where)) {
        check_reference_sketch(ds.get(), where, t, s, global);
        stored_kind(ds.get(), where);
        t.reference_shape = global;
        t.sketch->reference_is_sketch = true;
        data.set_reference(t.data_id, f, path);
        break;
      }
      if (t.sketch && static_cast<long long>(global[t.sketch->token_dim(global.size())] * t.sketch->rows) >
                          kMaxSketchSigns)
        input_error("{}: {} tokens x {} sketch rows is more than {} signs", where,
                    global[t.sketch->token_dim(global.size())], t.sketch->rows, kMaxSketchSigns);
      t.reference_stored = stored_kind(ds.get(), where);
      if (s != global) {  // a finding of the check at this tap (report: "shape"), the other taps still checked
        t.mismatched_reference_shape = s;
        break;
      }
      t.reference_shape = s;
      data.set_reference(t.data_id, f, path);
      break;
    }
  }
}

Mesh parse_mesh(const Root& root, const std::string& path) {
  Mesh mesh;
  try {
    mesh = Mesh::parse(root.mesh);
  } catch (const InputError& e) {
    input_error("{}: root attribute 'mesh': {}", path, e.what());
  }
  if (mesh.world_size() != root.world_size)
    input_error("{}: root attribute 'world_size' is {} but mesh '{}' has {} ranks", path,
                root.world_size, root.mesh, mesh.world_size());
  return mesh;
}

ActivationSet read_run_file(hid_t file, const std::string& path, const Root& root,
                            H5Data& data) {
  ActivationSet set;
  set.source = path;
  set.mesh = parse_mesh(root, path);
  set.world_size = static_cast<int>(root.world_size);
  set.info = root.info;
  auto names = list_datasets(file, "/taps", path);
  if (names.empty()) input_error("{}: no tap datasets under /taps", path);
  DeclaredBytes declared(path);
  long idx = 0;
  for (const auto& n : names) {
    std::string where = fmt::format("{}: tap '{}'", path, n);
    h5::ReadGuard guard(where + ": reading its metadata");
    Handle ds(H5Dopen2(file, ("/taps/" + n).c_str(), H5P_DEFAULT));
    TapData t;
    t.name = n;
    t.visit_index = idx++;
    t.stored = stored_kind(ds.get(), where);
    Shape s = dataset_shape(ds.get(), where, declared);
    if (s.empty() || s[0] != static_cast<std::size_t>(set.world_size))
      input_error("{}: a run file's tap must have shape [world_size={}, ...], found {}", where,
                  set.world_size, shape_str(s));
    t.local_shape.assign(s.begin() + 1, s.end());
    read_tap_attrs(ds.get(), where, set.mesh, t);
    if (t.sketch) input_error("{}: sketch taps are read from rank files (<prefix>.rank<R>.h5), not from a run file", where);
    t.data_id = data.add_tap("/taps/" + n);
    set.taps.push_back(std::move(t));
  }
  return set;
}

std::vector<std::string> rank_files(const std::string& prefix, int world) {
  std::vector<std::string> files;
  for (int r = 0; r < world; ++r) files.push_back(rank_file(prefix, r));
  return files;
}

// Each tap's metadata from its first holder, before any other rank is judged by it.
void read_first_holders(ActivationSet& set, const std::string& prefix, const std::vector<int>& first_holder,
                        OpenFiles& open) {
  for (std::size_t i = 0; i < set.taps.size(); ++i) {
    TapData& t = set.taps[i];
    const std::string fr = rank_file(prefix, first_holder[i]);
    const std::string where = fmt::format("{}: tap '{}'", fr, t.name);
    h5::ReadGuard guard(where + ": reading its metadata");
    Handle ds(H5Dopen2(open.get(fr), ("/taps/" + t.name).c_str(), H5P_DEFAULT));
    DeclaredBytes declared(fr);
    t.local_shape = dataset_shape(ds.get(), where, declared);
    t.stored = stored_kind(ds.get(), where);
    read_tap_attrs(ds.get(), where, set.mesh, t);
    if (!t.layout.owns(set.mesh, first_holder[i]))
      input_error("{}: attribute 'stage' is '{}', but rank {} is at {}={} (mesh {})", where, t.layout.stage_str(),
                  first_holder[i], t.layout.stage_axis,
                  set.mesh.coords(first_holder[i])[static_cast<std::size_t>(set.mesh.axis_index(t.layout.stage_axis))],
                  set.mesh.str());
  }
}

// Rank r's file holds every tap of every rank and of r's stages, no other,
// each as its first holder has it.
void check_rank_taps(ActivationSet& set, const std::string& prefix, int r, const std::vector<std::string>& names_r,
                     const std::vector<int>& first_holder, OpenFiles& open) {
  const std::string fr = rank_file(prefix, r);
  const hid_t file = open.get(fr);
  DeclaredBytes declared(fr);
  for (std::size_t i = 0; i < set.taps.size(); ++i) {
    TapData& t = set.taps[i];
    std::string where = fmt::format("{}: tap '{}'", fr, t.name);
    const bool here = std::find(names_r.begin(), names_r.end(), t.name) != names_r.end();
    const bool owns = t.layout.owns(set.mesh, r);
    if (!here && owns)
      input_error("{}: missing (rank {} has it{})", where, first_holder[i],
                  t.layout.staged() ? fmt::format(", and stage {} includes rank {}", t.layout.stage_str(), r) : "");
    if (here && !owns)
      input_error("{}: rank {} holds a tap of stage {} (rank {}'s attribute 'stage'), but is not on that stage "
                  "(mesh {})", where, r, t.layout.stage_str(), first_holder[i], set.mesh.str());
    if (!here) continue;
    h5::ReadGuard guard(where + ": reading its metadata");
    Handle ds(H5Dopen2(file, ("/taps/" + t.name).c_str(), H5P_DEFAULT));
    if (r != first_holder[i]) {
      Shape s = dataset_shape(ds.get(), where, declared);
      if (s != (t.sketch ? t.sketch->stored_shape : t.local_shape))
        input_error("{}: local shape {} differs from rank {}'s {}", where, shape_str(s), first_holder[i],
                    shape_str(t.sketch ? t.sketch->stored_shape : t.local_shape));
      const auto stage = h5::read_string_attr(ds.get(), "stage", where).value_or("");
      Layout here_stage;
      if (!stage.empty()) here_stage.parse_stage(stage);
      if (here_stage.stage_str() != t.layout.stage_str())
        input_error("{}: attribute 'stage' is '{}', rank {}'s is '{}'", where, stage, first_holder[i],
                    t.layout.stage_str());
    }
    if (auto differ = h5::read_string_attr(ds.get(), "microbatch_copies_differ", where))
      t.microbatch_copies_differ.emplace_back(r, *differ);
    read_sketch_piece(ds.get(), where, set.mesh, t, r, static_cast<std::size_t>(set.world_size));
  }
}

// Rank files of the prefix beyond this run's ranks: left by an earlier run on
// a larger mesh, they would be read by nothing and mislead whoever reads the
// folder. An input error naming them (the run's own files are not touched).
void refuse_stale_rank_files(const std::string& prefix, const ActivationSet& set) {
  const fs::path p(prefix);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string base = p.filename().string();
  std::vector<std::string> stale;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= base.size() + 8 || name.compare(0, base.size() + 5, base + ".rank") != 0 ||
        name.compare(name.size() - 3, 3, ".h5") != 0)
      continue;
    const std::string digits = name.substr(base.size() + 5, name.size() - base.size() - 8);
    if (digits.empty() || digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    if (std::stol(digits) >= set.world_size) stale.push_back(entry.path().string());
  }
  if (stale.empty()) return;
  std::sort(stale.begin(), stale.end());
  input_error("{}: {} rank file(s) beyond this run's {} ranks (mesh {}), left by another run: {}{}; remove them or "
              "write each run under its own prefix", prefix, stale.size(), set.world_size, set.mesh.str(),
              stale.front(), stale.size() > 1 ? fmt::format(" ... {}", stale.back()) : "");
}

// Each rank's file lists its taps. A tap of one pipeline stage (attribute
// `stage`) is in the files of that stage's ranks only; any other tap is in
// every file. Taps are taken in the order the files first show them (rank 0's
// first); the first holder's dataset gives the metadata the others must match.
ActivationSet read_rank_files(const std::string& prefix, const std::string& first_path,
                              std::shared_ptr<H5Data>& data, OpenFiles& open) {
  std::string f0 = rank_file(prefix, 0);
  if (!fs::exists(f0))
    input_error("{}: rank file for rank 0 is missing (looked for '{}')", first_path, f0);
  Root root = read_root(open.get(f0), f0, true);
  ActivationSet set;
  set.source = prefix;
  set.mesh = parse_mesh(root, f0);
  set.world_size = static_cast<int>(root.world_size);
  set.info = root.info;
  std::vector<std::vector<std::string>> names(static_cast<std::size_t>(set.world_size));
  std::map<std::string, std::size_t> index;  // tap name -> its place in set.taps
  std::vector<int> first_holder;
  for (int r = 0; r < set.world_size; ++r) {
    std::string fr = rank_file(prefix, r);
    if (!fs::exists(fr))
      input_error("{}: rank file for rank {} of {} is missing", fr, r, set.world_size);
    const hid_t file = open.get(fr);
    Root rr = read_root(file, fr, true);
    if (!rr.rank) input_error("{}: rank file without root attribute 'rank'", fr);
    if (*rr.rank != r) input_error("{}: root attribute 'rank' is {}, expected {}", fr, *rr.rank, r);
    if (rr.mesh != root.mesh || rr.world_size != root.world_size)
      input_error("{}: mesh '{}' differs from rank 0's '{}'", fr, rr.mesh, root.mesh);
    auto& names_r = names[static_cast<std::size_t>(r)];
    names_r = list_datasets(file, "/taps", fr);
    for (const auto& n : names_r)
      if (index.emplace(n, set.taps.size()).second) {
        TapData t;
        t.name = n;
        t.visit_index = static_cast<long>(set.taps.size());
        set.taps.push_back(std::move(t));
        first_holder.push_back(r);
      }
  }
  if (set.taps.empty()) input_error("{}: no tap datasets under /taps", f0);
  refuse_stale_rank_files(prefix, set);
  data = H5Data::rank_files(rank_files(prefix, set.world_size));
  for (auto& t : set.taps) t.data_id = data->add_tap("/taps/" + t.name);
  read_first_holders(set, prefix, first_holder, open);
  for (int r = 0; r < set.world_size; ++r)
    check_rank_taps(set, prefix, r, names[static_cast<std::size_t>(r)], first_holder, open);
  return set;
}

}  // namespace

std::string stored_kind_name(StoredKind k) {
  switch (k) {
    case StoredKind::float16: return "float16";
    case StoredKind::float32: return "float32";
    case StoredKind::float64: return "float64";
    default: return "integer";
  }
}

std::string narrow_reference(const TapData& t, const std::string& run_dtype) {
  if (!t.reference_stored || *t.reference_stored == StoredKind::float64) return {};
  const std::string& d = run_dtype.empty() ? t.dtype : run_dtype;
  const bool run_is_narrower = *t.reference_stored == StoredKind::float32 &&
                               (d == "bfloat16" || d == "float16" || d.rfind("float8", 0) == 0);
  return run_is_narrower ? std::string{} : stored_kind_name(*t.reference_stored);
}

ActivationSet read_activations(const std::string& source, const std::string& reference_path,
                               const std::map<std::string, StreamSplit>* split_like) {
  h5::silence_errors();
  ActivationSet set;
  std::shared_ptr<H5Data> data;
  std::vector<std::string> ref_files;
  std::smatch m;
  OpenFiles open;
  if (fs::exists(source) && !fs::is_directory(source)) {
    const hid_t file = open.get(source);
    Root root = read_root(file, source, true);
    if (root.rank.has_value()) {
      if (!std::regex_match(source, m, kRankFile))
        input_error("{}: has a 'rank' attribute but is not named <prefix>.rank<R>.h5", source);
      set = read_rank_files(m[1].str(), source, data, open);
      ref_files = rank_files(m[1].str(), set.world_size);
    } else {
      data = H5Data::run_file(source);
      set = read_run_file(file, source, root, *data);
      ref_files.push_back(source);
    }
  } else if (fs::exists(rank_file(source, 0))) {
    set = read_rank_files(source, source, data, open);
    ref_files = rank_files(source, set.world_size);
  } else {
    input_error("{}: no such file, and no rank files '{}'", source, rank_file(source, 0));
  }
  if (!reference_path.empty()) {
    read_root(open.get(reference_path), reference_path, false);  // must carry diffcheck_schema = 1
    ref_files.insert(ref_files.begin(), reference_path);
  }
  attach_references(set, *data, ref_files, open);
  expand_streams(set, *data, split_like);
  set.data = data;
  sort_taps(set.taps);
  return set;
}

}  // namespace dc
