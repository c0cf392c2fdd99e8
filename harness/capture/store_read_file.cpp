// Reading one activation file's parts (capture/store_read_file.h).
#include "harness/capture/store_read_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "harness/capture/h5_data.h"
#include "harness/capture/read_guard.h"
#include "harness/capture/store.h"
#include "harness/capture/store_sketch.h"
#include "harness/core/error.h"
#include "harness/core/text.h"

namespace dc::read {

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
  for (const char* k : {"scenario", "flags", "dtype", "producer", "size", "math", "loss_scale", "left_out"})
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

DeclaredBytes::DeclaredBytes(const std::string& path) : path_(path) {
  std::error_code ec;
  file_size_ = fs::file_size(path, ec);
}

void DeclaredBytes::add(std::uintmax_t bytes, const std::string& where) {
  const std::uintmax_t bound = std::max(kDeclaredFloor, kMaxExpansion * file_size_);
  if (__builtin_add_overflow(declared_, bytes, &declared_) || declared_ > bound)
    input_error("{}: the file declares more data than it can hold ({} bytes declared up to here, file of {} "
                "bytes; at most {}x its size or 1 GiB): corrupt or hostile",
                where, declared_, file_size_, kMaxExpansion);
}

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
  const auto stage = h5::read_string_attr(ds, "stage", where);
  try {
    t.layout = Layout::parse(spec, partial);
    if (stage) t.layout.parse_stage(*stage);
    t.layout.validate(mesh, t.local_shape.size());
  } catch (const InputError& e) {
    input_error("{}: attributes 'spec'/'partial'{}: {}", where, stage ? "/'stage'" : "", e.what());
  }
  if (auto order = h5::read_string_attr(ds, "block_order", where)) {
    try {
      t.layout.parse_block_order(*order, mesh, t.local_shape.size());
    } catch (const InputError& e) {
      input_error("{}: attribute 'block_order': {}", where, e.what());
    }
  }
  if (auto o = h5::read_int_attr(ds, "order", where)) t.order = *o;
  if (auto p = h5::read_int_attr(ds, "pipeline_stage", where)) {
    if (*p < 0 || !stage) input_error("{}: attribute 'pipeline_stage' is {}: a stage's tap (with 'stage') numbers its "
                                      "schedule stage from 0", where, *p);
    t.pipeline_stage = *p;
  }
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
  t.complex_parts = h5::read_int_attr(ds, "complex", where).value_or(0) != 0;
  if (t.complex_parts && (t.local_shape.empty() || t.local_shape.back() != 2))
    input_error("{}: attribute 'complex' marks a complex tensor's real view, whose last dimension is 2 "
                "(real, imaginary); this one's shape ends in {}", where,
                t.local_shape.empty() ? std::string("nothing (a scalar)") : std::to_string(t.local_shape.back()));
  if (auto r = h5::read_string_attr(ds, "reduced", where))
    for (const auto& axis : split(*r, '*')) {  // axes joined by '*', as `partial`'s
      if (mesh.axis_index(axis) < 0)
        input_error("{}: attribute 'reduced' is '{}'; '{}' is not an axis of the mesh {}", where, *r, axis,
                    mesh.str());
      t.reduced.push_back(axis);
    }
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
  read_streams_attr(ds, where, mesh, t);
  // After the sketch's attributes: a sketch tap's local shape is the sketched tensor's.
  if (auto m = h5::read_int_attr(ds, "microbatches", where)) {
    if (*m < 1 || t.local_shape.empty() || t.local_shape[0] % static_cast<std::size_t>(*m) != 0)
      input_error("{}: attribute 'microbatches' is {}; it must be >= 1 and divide the piece's first dimension "
                  "(local shape {})", where, *m, shape_str(t.local_shape));
    t.microbatches = *m;
  }
}

// Rank-file naming: "<prefix>.rank<R>.h5".

}  // namespace dc::read
