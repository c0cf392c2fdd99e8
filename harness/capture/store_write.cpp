// Run-file writer: one file for every rank, written with parallel HDF5.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <thread>
#include <utility>

#include "harness/capture/h5util.h"
#include "harness/capture/store.h"
#include "harness/capture/store_layout.h"
#include "harness/core/agree.h"
#include "harness/core/comm_native.h"
#include "harness/core/error.h"
#include "harness/core/interrupt.h"

namespace dc {
namespace {

using h5::Handle;

// One line per tap: what every rank must agree on before anything is written.
std::string tap_manifest(const TapRecorder& taps) {
  std::string m;
  for (const auto& r : taps.records())
    m += fmt::format("{}\t{}\t{}\t{}\n", r.name, shape_str(r.local.shape), r.opts.layout.spec_str(),
                     r.opts.layout.partial_str());
  return m;
}

std::string first_difference(const std::string& mine, const std::string& root) {
  std::stringstream a(mine), b(root);
  std::string la, lb;
  while (true) {
    bool ga = static_cast<bool>(std::getline(a, la));
    bool gb = static_cast<bool>(std::getline(b, lb));
    if (!ga && !gb) return "";
    if (la != lb || ga != gb)
      return fmt::format("this rank has '{}' where rank 0 has '{}'", ga ? la : "(no more taps)",
                         gb ? lb : "(no more taps)");
  }
}

// name\tdim,dim,...\telements\tblocks\n for each reference this rank holds
// boxes of.
std::string reference_manifest(const TapRecorder& taps) {
  std::string m;
  for (const auto& [name, part] : taps.references()) {
    std::string dims;
    for (auto d : part.global) dims += fmt::format("{}{}", dims.empty() ? "" : ",", d);
    std::size_t elements = 0;
    for (const auto& b : part.blocks) elements += b.data.size();
    m += fmt::format("{}\t{}\t{}\t{}\n", name, dims, elements, part.blocks.size());
  }
  return m;
}

// Every rank's manifest merged; identical on every rank, so every rank takes
// the same decisions (and the same error) below.
std::map<std::string, ReferenceEntry> merge_reference_manifests(
    const std::vector<std::string>& all) {
  std::map<std::string, ReferenceEntry> out;
  for (std::size_t r = 0; r < all.size(); ++r) {
    std::stringstream ss(all[r]);
    std::string line;
    while (std::getline(ss, line)) {
      std::vector<std::string> f;
      std::stringstream fs(line);
      for (std::string x; std::getline(fs, x, '\t');) f.push_back(x);
      if (f.size() == 3) f.insert(f.begin() + 1, "");  // a scalar: no dims
      Shape shape;
      std::stringstream ds(f[1]);
      for (std::string d; std::getline(ds, d, ',');) shape.push_back(std::stoull(d));
      auto [it, fresh] = out.try_emplace(f[0], ReferenceEntry{shape, 0, 0, static_cast<int>(r)});
      if (!fresh && it->second.shape != shape)
        fail("reference of tap '{}' has shape {} on rank {} but {} on rank {}", f[0],
             shape_str(it->second.shape), it->second.first_rank, shape_str(shape), r);
      it->second.elements += std::stoull(f[2]);
      it->second.max_blocks = std::max<std::size_t>(it->second.max_blocks, std::stoull(f[3]));
    }
  }
  for (const auto& [name, e] : out)
    if (e.elements != numel(e.shape))
      fail("reference of tap '{}' ({}) has {} elements computed over all ranks, expected {} once each",
           name, shape_str(e.shape), e.elements, numel(e.shape));
  return out;
}

// Parallel write: this rank writes its row `row` of `dims`, a contiguous
// range of the file. Independent MPI-IO, not collective: each rank's piece is
// one contiguous range, which collective buffering cannot improve, while a
// collective call per tap made every rank wait for all (flux_tp at 16 ranks
// on 2 cores: the run file in 0.31 s instead of 0.61 s).
void write_row(hid_t ds, hid_t mem_type, const void* data, const Shape& dims, std::size_t row,
               int rank, const std::string& what) {
  Handle fspace(H5Dget_space(ds));
  std::vector<hsize_t> start(dims.size(), 0), count(dims.begin(), dims.end());
  start[0] = row;
  count[0] = 1;
  H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  hsize_t n = 1;
  for (auto c : count) n *= c;
  Handle mspace(H5Screate_simple(1, &n, nullptr));
  if (n == 0) H5Sselect_none(mspace.get());
  Handle xfer(H5Pcreate(H5P_DATASET_XFER));
  H5Pset_dxpl_mpio(xfer.get(), H5FD_MPIO_INDEPENDENT);
  if (H5Dwrite(ds, mem_type, mspace.get(), fspace.get(), xfer.get(), data) < 0)
    fail("rank {}: HDF5 parallel write of '{}' failed: {}", rank, what, h5::last_error());
}

void write_taps(hid_t file, const TapRecorder& taps, int world, int rank) {
  for (const auto& r : taps.records()) {
    Handle ds = create_tap(file, r, taps, world, rank);
    Shape dims{static_cast<std::size_t>(world)};
    dims.insert(dims.end(), r.local.shape.begin(), r.local.shape.end());
    write_row(ds.get(), H5T_NATIVE_FLOAT, r.local.ptr(), dims, static_cast<std::size_t>(rank), rank,
              "/taps/" + r.name);
  }
}

// Parallel write of each reference: every rank writes the boxes it computed,
// one (independent, see write_row) call per box; ranks with fewer boxes join
// the later calls with nothing, as every rank makes the same HDF5 calls (the
// file's metadata operations are collective). A box's values are contiguous
// in memory and in row-major order in the file, which a union of boxes would
// not be.
void write_references(hid_t file, const Comm& world, const TapRecorder& taps,
                      const std::map<std::string, ReferenceEntry>& manifest) {
  const int rank = world.rank();
  for (const auto& [name, entry] : manifest) {
    const std::string path = "/reference/" + name;
    Handle ds = create_dataset(file, path, H5T_IEEE_F64LE, entry.shape, rank);
    auto it = taps.references().find(name);
    const std::vector<ReferenceBlock> none;
    const auto& blocks = it != taps.references().end() ? it->second.blocks : none;
    for (std::size_t k = 0; k < entry.max_blocks; ++k) {
      Handle fspace(H5Dget_space(ds.get()));
      const double* data = nullptr;
      hsize_t n = 0;
      if (k < blocks.size() && blocks[k].data.size() > 0) {
        const auto& b = blocks[k];
        if (entry.shape.empty()) {
          H5Sselect_all(fspace.get());
        } else {
          std::vector<hsize_t> start(b.start.begin(), b.start.end()), count(b.data.shape.begin(), b.data.shape.end());
          H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
        }
        data = b.data.ptr();
        n = b.data.size();
      } else {
        H5Sselect_none(fspace.get());
      }
      const hsize_t mem_n = std::max<hsize_t>(n, 1);
      Handle mspace(H5Screate_simple(1, &mem_n, nullptr));
      if (n == 0) H5Sselect_none(mspace.get());
      Handle xfer(H5Pcreate(H5P_DATASET_XFER));
      H5Pset_dxpl_mpio(xfer.get(), H5FD_MPIO_INDEPENDENT);
      if (H5Dwrite(ds.get(), H5T_NATIVE_DOUBLE, mspace.get(), fspace.get(), xfer.get(), data) < 0)
        fail("rank {}: HDF5 parallel write of '{}' failed: {}", rank, path, h5::last_error());
    }
  }
}

}  // namespace

static Handle link_props() {
  Handle lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  return lcpl;
}

Handle create_dataset(hid_t file, const std::string& path, hid_t type, const Shape& dims, int rank, hid_t dcpl) {
  std::vector<hsize_t> hd(dims.begin(), dims.end());
  Handle space(H5Screate_simple(static_cast<int>(hd.size()), hd.data(), nullptr));
  Handle lcpl = link_props();
  Handle ds(
      H5Dcreate2(file, path.c_str(), type, space.get(), lcpl.get(), dcpl, H5P_DEFAULT));
  if (!ds.valid())
    fail("rank {}: HDF5 cannot create dataset '{}': {}", rank, path, h5::last_error());
  return ds;
}

// A tap's dataset [world, *local] with its attributes.
Handle create_tap(hid_t file, const TapRecord& r, const TapRecorder& taps, int world, int rank, hid_t dcpl) {
  Shape dims{static_cast<std::size_t>(world)};
  dims.insert(dims.end(), r.local.shape.begin(), r.local.shape.end());
  Handle ds = create_dataset(file, "/taps/" + r.name, H5T_IEEE_F32LE, dims, rank, dcpl);
  const auto& l = r.opts.layout;
  if (!l.spec.empty()) h5::write_string_attr(ds.get(), "spec", l.spec_str());
  if (!l.partial.empty()) h5::write_string_attr(ds.get(), "partial", l.partial_str());
  h5::write_int_attr(ds.get(), "order", r.order);
  if (taps.dtype() == DType::bfloat16) h5::write_string_attr(ds.get(), "dtype", "bfloat16");
  if (r.opts.reduction_depth > 0)
    h5::write_int_attr(ds.get(), "reduction_depth", r.opts.reduction_depth);
  if (r.opts.atol) h5::write_float_attr(ds.get(), "atol", *r.opts.atol);
  if (r.opts.rtol) h5::write_float_attr(ds.get(), "rtol", *r.opts.rtol);
  if (r.opts.tolerance_factor != 1.0) h5::write_float_attr(ds.get(), "tolerance_factor", r.opts.tolerance_factor);
  if (!r.opts.image.empty()) h5::write_string_attr(ds.get(), "image", r.opts.image);
  if (r.opts.per_mesh) h5::write_int_attr(ds.get(), "per_mesh", 1);
  if (l.staged()) h5::write_string_attr(ds.get(), "stage", l.stage_str());
  if (r.opts.microbatches > 0) h5::write_int_attr(ds.get(), "microbatches", r.opts.microbatches);
  return ds;
}

// The root attributes and the /taps group (links in creation order).
Handle write_run_file_header(hid_t file, const std::string& where, const RunInfo& info, const TapRecorder& taps,
                             int world_size, int rank) {
    h5::write_int_attr(file, "diffcheck_schema", 1);
  h5::write_string_attr(file, "mesh", taps.mesh().str());
  h5::write_int_attr(file, "world_size", world_size);
  h5::write_string_attr(file, "scenario", info.scenario);
  h5::write_string_attr(file, "flags", info.flags);
  h5::write_string_attr(file, "dtype", info.dtype);
  h5::write_int_attr(file, "seed", static_cast<long long>(info.seed));
  h5::write_string_attr(file, "producer", info.producer);
  if (!info.size.empty()) h5::write_string_attr(file, "size", info.size);

  Handle gcpl(H5Pcreate(H5P_GROUP_CREATE));
  H5Pset_link_creation_order(gcpl.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  Handle taps_group(H5Gcreate2(file, "/taps", H5P_DEFAULT, gcpl.get(), H5P_DEFAULT));
  if (!taps_group.valid())
    fail("rank {}: HDF5 cannot create /taps in '{}': {}", rank, where, h5::last_error());
  return taps_group;
}

// A new file's creation properties: links in creation order.
Handle run_file_creation_props() {
  Handle fcpl(H5Pcreate(H5P_FILE_CREATE));
  H5Pset_link_creation_order(fcpl.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  return fcpl;
}

// A run-file error only this rank saw, where the others may be waiting for it
// in a collective (or sending to it): reported here, the partial files (the
// watch directory among them) removed, and the job ended (exit 2).
[[noreturn]] static void end_job_from_this_rank(const std::string& message) {
  interrupt::verdict_reached();
  interrupt::remove_partial_files();
  spdlog::error("{}", message);
  std::fflush(nullptr);
  Comm::abort(2);
}

// The temporary run file, created by HDF5 (collectively with MPI-IO, or by
// rank 0 alone for a gathered write).
static Handle create_run_file(const Comm& world, const std::string& tmp, WriteMode mode) {
  const int rank = world.rank();
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS));
  if (mode == WriteMode::collective) {
    H5Pset_fapl_mpio(fapl.get(), CommAccess::native(world), MPI_INFO_NULL);
    H5Pset_all_coll_metadata_ops(fapl.get(), true);
    H5Pset_coll_metadata_write(fapl.get(), true);
  }
  Handle fcpl = run_file_creation_props();
  Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()));
  if (!file.valid() && mode == WriteMode::gathered) {
    // The others are about to send their rows to this rank.
    end_job_from_this_rank(fmt::format("rank {}: HDF5 cannot create run file '{}': {}", rank, tmp, h5::last_error()));
  }
  if (!file.valid())
    fail("rank {}: HDF5 cannot create run file '{}': {}", rank, tmp, h5::last_error());
  return file;
}

// WriteMode::collective and ::gathered: HDF5 writes every byte (MPI-IO, or
// rank 0 alone).
static void write_with_hdf5(const Comm& world, const std::string& tmp, const std::string& path, const RunInfo& info,
                            const TapRecorder& taps, WriteMode mode,
                            const std::map<std::string, ReferenceEntry>& manifest,
                     const std::map<std::string, std::vector<HeldBox>>& boxes, const std::function<void()>& created) {
  const int rank = world.rank();
  bool closed = true, stuck = false;
  std::string close_error;
  if (mode == WriteMode::collective || rank == 0) {
    Handle file = create_run_file(world, tmp, mode);
    if (created) created();

    Handle taps_group = write_run_file_header(file.get(), tmp, info, taps, world.size(), rank);

    try {
      if (mode == WriteMode::collective) {
        write_taps(file.get(), taps, world.size(), rank);
        write_references(file.get(), world, taps, manifest);
      } else {
        receive_and_write(file.get(), world, taps, manifest, boxes);
      }
    } catch (const Error& e) {
      // A write failed on this rank (a full disk, a quota) while the others
      // may be inside the same collective write, or sending to this rank:
      // unwinding would wait for them forever. Say it and end the job.
      std::remove(tmp.c_str());
      file.release();
      end_job_from_this_rank(fmt::format("{}; nothing was written to '{}'", e.what(), path));
    }
    const bool flushed = H5Fflush(file.get(), H5F_SCOPE_GLOBAL) >= 0;
    // Written with MPI-IO, a flush that failed here may not have failed on
    // the others, whose close would wait for this rank: end the job (main).
    if (!flushed && mode == WriteMode::collective)
      fail("rank {}: HDF5 cannot flush '{}': {}; nothing was written to '{}'", rank, tmp, h5::last_error(), path);
    if (!flushed) {
      close_error = "cannot flush: " + h5::last_error();
      // The file is lost: its blocks are given back first, so that HDF5 can
      // write what closing writes. A file HDF5 could not close stays open
      // inside it, and its own clean-up at MPI_Finalize then faults on it.
      if (::truncate(tmp.c_str(), 0) != 0) spdlog::warn("rank {}: cannot truncate '{}'", rank, tmp);
    }
    taps_group.reset();
    // Closing writes the last metadata: a full disk shows here.
    const hid_t id = file.release();
    closed = H5Fclose(id) >= 0 && flushed;
    if (!closed && flushed) close_error = h5::last_error();
    stuck = H5Iis_valid(id) > 0;
  } else {
    if (created) created();
    send_rows_and_boxes(world, taps, manifest);
  }
  // No rank renames a file that any rank could not close. Every rank learns
  // the first failure's words: an AgreedError, which rank 0 reports once
  // before every rank finalizes (exit 2); but a rank that HDF5 could not
  // close a file for must not finalize (see above): it reports and ends the
  // job itself.
  try {
    agreed_on_all(world, [&] {
      if (!closed)
        fail("rank {}: closing run file '{}' failed ({}); nothing was written to '{}'", rank, tmp, close_error, path);
      return std::string();
    });
  } catch (const Error& e) {
    if (rank == 0) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
    }
    if (stuck) end_job_from_this_rank(e.what());
    throw;
  }
}

// Agree on the tap list first: a rank that recorded something else would
// otherwise make the collective HDF5 calls that follow hang or corrupt the file.
static void agree_on_taps(const Comm& world, const TapRecorder& taps) {
  const int rank = world.rank();
  const std::string mine = tap_manifest(taps);
  const std::string root = world.broadcast_string(mine, 0);
  const std::string diff = first_difference(mine, root);
  if (world.max_int(diff.empty() ? 0 : 1) != 0) {
    if (!diff.empty()) fail("rank {}: taps differ from rank 0: {}", rank, diff);
    fail("rank {}: another rank recorded different taps than rank 0 (see its message)", rank);
  }
}

PendingRunFile begin_run_file(const Comm& world, const std::string& path, const RunInfo& info,
                              const TapRecorder& taps) {
  h5::silence_errors();
  agree_on_taps(world, taps);
  return PendingRunFile(world, path,
                        std::make_unique<PositionalWrites>(world, path + ".tmp", info, taps,
                                                           std::map<std::string, ReferenceEntry>{},
                                                           std::function<void()>{}, PositionalPart::taps));
}

PendingRunFile start_run_file(const Comm& world, const std::string& path, const RunInfo& info,
                              const TapRecorder& taps, WriteMode mode, const std::function<void()>& created,
                              PendingRunFile* begun) {
  h5::silence_errors();
  if (begun && mode != WriteMode::positional)
    fail("rank {}: a run file begun before its references is written at every rank's offsets only", world.rank());
  if (!begun) agree_on_taps(world, taps);  // a begun file's were agreed, and no tap came after

  // Agreed by every rank before the file exists: a reference whose rows are
  // not covered is an error on all ranks alike.
  const auto manifest =
      merge_reference_manifests(world.all_gather_strings(reference_manifest(taps)));
  // Where every rank's reference boxes are, for the rank that writes them all.
  const auto boxes = mode == WriteMode::gathered ? all_reference_boxes(world, taps)
                                                 : std::map<std::string, std::vector<HeldBox>>{};
  const std::string tmp = path + ".tmp";
  if (begun) {
    begun->add(std::make_unique<PositionalWrites>(world, tmp, info, taps, manifest, created, PositionalPart::references));
    return std::move(*begun);
  }
  if (mode == WriteMode::positional)
    return PendingRunFile(world, path, std::make_unique<PositionalWrites>(world, tmp, info, taps, manifest, created));
  write_with_hdf5(world, tmp, path, info, taps, mode, manifest, boxes, created);
  return PendingRunFile(world, path, nullptr);
}

void write_run_file(const Comm& world, const std::string& path, const RunInfo& info, const TapRecorder& taps,
                    WriteMode mode, const std::function<void()>& created) {
  start_run_file(world, path, info, taps, mode, created).finish();
}

}  // namespace dc
