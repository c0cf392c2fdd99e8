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
#include "harness/capture/store_sketch.h"

namespace dc {
namespace {

using h5::Handle;
namespace fs = std::filesystem;

Handle open_file(const std::string& path) {
  h5::silence_errors();
  if (!fs::exists(path)) input_error("{}: no such file", path);
  if (fs::is_directory(path)) input_error("{}: is a directory, not an activation file", path);
  h5::ReadGuard guard(path + ": opening the file");
  Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (f.valid()) return f;
  const std::string why = h5::last_error();
  // Which failure: only now asked (it opens the file once more).
  if (H5Fis_hdf5(path.c_str()) <= 0) input_error("{}: not an HDF5 file", path);
  input_error("{}: cannot open HDF5 file (truncated or damaged?): {}", path, why);
}

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
  std::map<std::string, Handle> open_;
};

struct Root {
  long long schema = 0;
  std::string mesh;
  long long world_size = 0;
  std::optional<long long> rank;
  std::map<std::string, std::string> info;
};

Root read_root(hid_t file, const std::string& path, bool need_mesh) {
  h5::ReadGuard guard(path + ": reading the root attributes");
  Root r;
  auto schema = h5::read_int_attr(file, "diffcheck_schema", path);
  if (!schema) input_error("{}: missing root attribute 'diffcheck_schema'", path);
  if (*schema != 1)
    input_error("{}: root attribute 'diffcheck_schema' is {}; this diffcheck reads version 1",
                path, *schema);
  r.schema = *schema;
  auto mesh = h5::read_string_attr(file, "mesh", path);
  auto world = h5::read_int_attr(file, "world_size", path);
  if (need_mesh && !mesh) input_error("{}: missing root attribute 'mesh'", path);
  if (need_mesh && !world) input_error("{}: missing root attribute 'world_size'", path);
  r.mesh = mesh.value_or("");
  r.world_size = world.value_or(1);
  r.rank = h5::read_int_attr(file, "rank", path);
  for (const char* k : {"scenario", "flags", "dtype", "producer", "size", "math"})
    if (auto v = h5::read_string_attr(file, k, path)) r.info[k] = *v;
  if (auto seed = h5::read_int_attr(file, "seed", path)) r.info["seed"] = std::to_string(*seed);
  return r;
}

// Limits against hostile files: a file may declare at most this many times
// its own size in data (beyond kDeclaredFloor), and groups nest this deep.
constexpr std::uintmax_t kMaxExpansion = 100;
constexpr std::uintmax_t kDeclaredFloor = std::uintmax_t{1} << 30;
constexpr int kMaxDepth = 32;
constexpr std::size_t kMaxLinks = 1'000'000;

// Dataset paths below `group`, in creation order when the file tracks it,
// otherwise in name order. Every link must be a hard link (a soft or
// external link could read another file or loop), at most kMaxDepth deep.
// Object types come from one H5Ovisit, so the walk is linear in the links.
std::vector<std::string> list_datasets(hid_t file, const char* group, const std::string& path) {
  std::vector<std::string> names;
  h5::ReadGuard guard(fmt::format("{}: listing '{}'", path, group));
  if (H5Lexists(file, group, H5P_DEFAULT) <= 0) return names;
  Handle g(H5Gopen2(file, group, H5P_DEFAULT));
  if (!g.valid()) input_error("{}: '{}' is not a group", path, group);
  struct Ctx {
    std::vector<std::string>* names;
    std::string bad;  // why the walk stopped
    std::size_t links = 0;
  } ctx{&names, "", 0};
  auto check_link = [](hid_t, const char* name, const H5L_info_t* info, void* data) -> herr_t {
    auto* c = static_cast<Ctx*>(data);
    const int depth = 1 + static_cast<int>(std::count(name, name + std::strlen(name), '/'));
    if (info->type != H5L_TYPE_HARD)
      c->bad = fmt::format("'{}' is a {} link; only plain datasets and groups are read (nothing outside the "
                           "files named)",
                           name, info->type == H5L_TYPE_SOFT ? "soft" : info->type == H5L_TYPE_EXTERNAL ? "external" : "user-defined");
    else if (depth > kMaxDepth)
      c->bad = fmt::format("groups nested deeper than {} levels at '{}'", kMaxDepth, name);
    else if (++c->links > kMaxLinks)
      c->bad = fmt::format("more than {} links", kMaxLinks);
    return c->bad.empty() ? 0 : 1;
  };
  auto collect = [](hid_t, const char* name, const H5O_info_t* info, void* data) -> herr_t {
    auto* c = static_cast<Ctx*>(data);
    if (info->type == H5O_TYPE_DATASET && std::strcmp(name, ".") != 0) c->names->push_back(name);
    return 0;
  };
  for (auto index : {H5_INDEX_CRT_ORDER, H5_INDEX_NAME}) {
    ctx.bad.clear();
    ctx.links = 0;
    names.clear();
    herr_t links = H5Lvisit(g.get(), index, H5_ITER_INC, check_link, &ctx);
    if (!ctx.bad.empty()) input_error("{}: under '{}': {}", path, group, ctx.bad);
    if (links >= 0 && H5Ovisit2(g.get(), index, H5_ITER_INC, collect, &ctx, H5O_INFO_BASIC) >= 0) return names;
    H5Eclear2(H5E_DEFAULT);  // no creation order in this file: by name
  }
  input_error("{}: cannot list '{}': {}", path, group, h5::last_error());
}

// Declared data against the file's size: a small file that declares a huge
// (compressed or unallocated) dataset would take hours or all memory.
class DeclaredBytes {
 public:
  explicit DeclaredBytes(const std::string& path) : path_(path) {
    std::error_code ec;
    file_size_ = fs::file_size(path, ec);
  }
  void add(std::uintmax_t bytes, const std::string& where) {
    const std::uintmax_t bound = std::max(kDeclaredFloor, kMaxExpansion * file_size_);
    if (__builtin_add_overflow(declared_, bytes, &declared_) || declared_ > bound)
      input_error("{}: the file declares more data than it can hold ({} bytes declared up to here, file of {} "
                  "bytes; at most {}x its size or 1 GiB): corrupt or hostile",
                  where, declared_, file_size_, kMaxExpansion);
  }

 private:
  std::string path_;
  std::uintmax_t file_size_ = 0, declared_ = 0;
};

StoredKind stored_kind(hid_t ds, const std::string& where) {
  Handle type(H5Dget_type(ds));
  auto cls = H5Tget_class(type.get());
  if (cls == H5T_INTEGER) return StoredKind::integer;
  if (cls == H5T_FLOAT) {
    switch (H5Tget_size(type.get())) {
      case 2: return StoredKind::float16;
      case 4: return StoredKind::float32;
      case 8: return StoredKind::float64;
    }
  }
  input_error("{}: element type is not IEEE float16/32/64 or integer", where);
}

// The dataset's shape, after refusing what a reader should not follow or
// cannot hold: virtual datasets and external raw storage (data outside the
// named files), element counts that overflow, and more declared data than
// the file can hold (see DeclaredBytes).
Shape dataset_shape(hid_t ds, const std::string& where, DeclaredBytes& declared) {
  Handle dcpl(H5Dget_create_plist(ds));
  if (dcpl.valid()) {
    if (H5Pget_layout(dcpl.get()) == H5D_VIRTUAL)
      input_error("{}: a virtual dataset (its data lives in other files); not read", where);
    if (H5Pget_external_count(dcpl.get()) > 0)
      input_error("{}: stored in external raw files; not read", where);
  }
  Handle space(H5Dget_space(ds));
  int nd = H5Sget_simple_extent_ndims(space.get());
  if (nd < 0) input_error("{}: unreadable dataspace", where);
  std::vector<hsize_t> d(static_cast<std::size_t>(nd));
  if (nd > 0) H5Sget_simple_extent_dims(space.get(), d.data(), nullptr);
  Handle type(H5Dget_type(ds));
  std::uint64_t bytes = std::max<std::size_t>(H5Tget_size(type.get()), 1);
  for (hsize_t x : d)
    if (__builtin_mul_overflow(bytes, static_cast<std::uint64_t>(x), &bytes))
      input_error("{}: shape {} overflows a 64-bit size", where, fmt::format("{}", fmt::join(d, "x")));
  declared.add(bytes, where);
  return Shape(d.begin(), d.end());
}

// Attributes of a tap dataset, checked against the mesh.
void read_tap_attrs(hid_t ds, const std::string& where, const Mesh& mesh, TapData& t) {
  auto spec = h5::read_string_attr(ds, "spec", where).value_or("");
  auto partial = h5::read_string_attr(ds, "partial", where).value_or("");
  try {
    t.layout = Layout::parse(spec, partial);
    t.layout.validate(mesh, t.local_shape.size());
  } catch (const InputError& e) {
    input_error("{}: attributes 'spec'/'partial': {}", where, e.what());
  }
  if (auto o = h5::read_int_attr(ds, "order", where)) t.order = *o;
  t.dtype = h5::read_string_attr(ds, "dtype", where).value_or(stored_kind_name(t.stored));
  static const std::vector<std::string> known = {"float16", "bfloat16", "float32", "float64",
                                                 "integer"};
  if (std::find(known.begin(), known.end(), t.dtype) == known.end() &&
      t.dtype.rfind("int", 0) != 0 && t.dtype.rfind("uint", 0) != 0)
    input_error("{}: attribute 'dtype' is '{}' (expected float16, bfloat16, float32, float64)",
                where, t.dtype);
  t.atol = h5::read_float_attr(ds, "atol", where);
  t.rtol = h5::read_float_attr(ds, "rtol", where);
  for (const auto& [name, v] : {std::pair{"atol", t.atol}, std::pair{"rtol", t.rtol}})
    if (v && !(std::isfinite(*v) && *v >= 0))
      input_error("{}: attribute '{}' is {}; a tolerance must be finite and >= 0", where, name, *v);
  t.image = h5::read_string_attr(ds, "image", where).value_or("");
  t.per_mesh = h5::read_int_attr(ds, "per_mesh", where).value_or(0) != 0;
  t.tolerance_factor = h5::read_float_attr(ds, "tolerance_factor", where);
  if (t.tolerance_factor && !(std::isfinite(*t.tolerance_factor) && *t.tolerance_factor >= 1))
    input_error("{}: attribute 'tolerance_factor' is {}; it must be finite and >= 1", where, *t.tolerance_factor);
  if (auto d = h5::read_int_attr(ds, "reduction_depth", where)) {
    if (*d < 0) input_error("{}: attribute 'reduction_depth' is {}; it must be >= 0", where, *d);
    t.reduction_depth = *d;
  }
  if (auto n = h5::read_int_attr(ds, "rounding_steps", where)) {
    if (*n < 1) input_error("{}: attribute 'rounding_steps' is {}; it must be >= 1", where, *n);
    t.rounding_steps = *n;
  }
  read_sketch_attrs(ds, where, mesh, t);
}

// Rank-file naming: "<prefix>.rank<R>.h5".
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
      if (t.sketch && static_cast<long long>(global[global.size() - 2] * t.sketch->rows) > kMaxSketchSigns)
        input_error("{}: {} tokens x {} sketch rows is more than {} signs", where, global[global.size() - 2],
                    t.sketch->rows, kMaxSketchSigns);
      if (s != global)
        input_error("{}: reference shape {} does not match the tap's global shape {} (local {} "
                    "with spec '{}' on mesh {}){}",
                    where, shape_str(s), shape_str(global), shape_str(t.local_shape),
                    t.layout.spec_str(), set.mesh.str(),
                    t.layout.sharded_axes().empty() && t.layout.partial.empty() && set.mesh.world_size() > 1
                        ? ": the rank files call it replicated; if it is sharded, give the tap a layout "
                          "(its 'spec' attribute; layouts= in diffcheck.torch)"
                        : "");
      stored_kind(ds.get(), where);
      t.reference_shape = s;
      data.set_reference(t.data_id, f, path);
      break;
    }
  }
}

void sort_taps(std::vector<TapData>& taps) {
  std::stable_sort(taps.begin(), taps.end(), [](const TapData& a, const TapData& b) {
    if (a.order.has_value() != b.order.has_value()) return a.order.has_value();
    if (a.order && *a.order != *b.order) return *a.order < *b.order;
    return a.visit_index < b.visit_index;
  });
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

ActivationSet read_rank_files(const std::string& prefix, const std::string& first_path,
                              std::shared_ptr<H5Data>& data, OpenFiles& open) {
  std::string f0 = rank_file(prefix, 0);
  if (!fs::exists(f0))
    input_error("{}: rank file for rank 0 is missing (looked for '{}')", first_path, f0);
  const hid_t file0 = open.get(f0);
  Root root = read_root(file0, f0, true);
  ActivationSet set;
  set.source = prefix;
  set.mesh = parse_mesh(root, f0);
  set.world_size = static_cast<int>(root.world_size);
  set.info = root.info;
  auto names = list_datasets(file0, "/taps", f0);
  if (names.empty()) input_error("{}: no tap datasets under /taps", f0);
  for (std::size_t i = 0; i < names.size(); ++i) {
    TapData t;
    t.name = names[i];
    t.visit_index = static_cast<long>(i);
    set.taps.push_back(std::move(t));
  }
  data = H5Data::rank_files(rank_files(prefix, set.world_size));
  for (auto& t : set.taps) t.data_id = data->add_tap("/taps/" + t.name);
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
    auto names_r = list_datasets(file, "/taps", fr);
    DeclaredBytes declared(fr);
    for (auto& t : set.taps) {
      std::string where = fmt::format("{}: tap '{}'", fr, t.name);
      if (std::find(names_r.begin(), names_r.end(), t.name) == names_r.end())
        input_error("{}: missing (rank 0 has it)", where);
      h5::ReadGuard guard(where + ": reading its metadata");
      Handle ds(H5Dopen2(file, ("/taps/" + t.name).c_str(), H5P_DEFAULT));
      Shape s = dataset_shape(ds.get(), where, declared);
      StoredKind k = stored_kind(ds.get(), where);
      if (r == 0) {
        t.local_shape = s;
        t.stored = k;
        read_tap_attrs(ds.get(), where, set.mesh, t);
      } else if (s != (t.sketch ? t.sketch->stored_shape : t.local_shape)) {
        input_error("{}: local shape {} differs from rank 0's {}", where, shape_str(s),
                    shape_str(t.sketch ? t.sketch->stored_shape : t.local_shape));
      }
      read_sketch_piece(ds.get(), where, set.mesh, t, r, static_cast<std::size_t>(set.world_size));
    }
    if (names_r.size() != set.taps.size())
      input_error("{}: has {} taps, rank 0 has {}", fr, names_r.size(), set.taps.size());
  }
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

ActivationSet read_activations(const std::string& source, const std::string& reference_path) {
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
  set.data = data;
  sort_taps(set.taps);
  return set;
}

}  // namespace dc
