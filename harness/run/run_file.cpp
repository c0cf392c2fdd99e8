// The run file's side of a run: where it goes, how big it is, whether there
// is room for it and how it is written (run_file.h).
#include "harness/run/run_file.h"

#include <spdlog/spdlog.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>

#include "harness/core/agree.h"
#include "harness/core/error.h"
#include "harness/core/files.h"
#include "harness/core/interrupt.h"
#include "harness/core/watchdog.h"

namespace dc {

// What an interrupted run leaves must go with it (interrupt.h): the run
// file's temporary, OpenMPI's named semaphore for it (its shared-file-pointer
// component makes /dev/shm/sem.OMPIO_<file name> at open and removes it at
// close only), and the watch directory.
void remove_run_file_when_stopped(const std::string& out) {
  const std::string tmp = out + ".tmp";
  interrupt::remove_when_stopped(tmp);
  interrupt::remove_when_stopped("/dev/shm/sem.OMPIO_" + std::filesystem::path(tmp).filename().string());
  interrupt::remove_directory_when_stopped(out + ".watch");
}

// Every rank makes the run file's directory and the watchdog's beside it: on
// hosts that do not share it, rank 0's alone would leave the others without
// one. Returns the run file's directory.
std::string make_output_directories(const std::string& out) {
  std::error_code ec;
  const auto parent = std::filesystem::path(out).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  prepare_watch_directory(out + ".watch");  // before directory_shared's barrier: no watchdog runs yet
  return parent.string();
}

// --store mpiio needs a directory every rank writes into (checked before the
// scenario runs, so the refusal comes at once).
void refuse_store_unless_shared(const std::string& out, const std::string& store, bool shared) {
  const auto parent = std::filesystem::path(out).parent_path();
  if ((store == "mpiio" || store == "pwrite") && !shared)
    input_error(
        "--store {}: the output directory '{}' is not shared by all ranks (rank 0's probe file there is "
        "not seen by every rank: node-local storage?); MPI-IO would leave a partial file on each host. Use a "
        "directory every host mounts, or --store gather (the default 'auto' chooses it)",
        store, parent.empty() ? "." : parent.string());
}

// Run files up to this size are written by rank 0 under --store auto
// (DIFFCHECK_GATHER_MAX_MIB, default 256): MPI-IO's collective creates and
// writes of every tap cost each rank a synchronisation, more than sending
// the rows to rank 0. A 16-rank flux_tp run (2 cores) wrote its 77 MiB in
// 0.17 s with MPI-IO and in 0.08 s gathered.
std::uint64_t gather_limit_bytes() {
  std::uint64_t mib = 256;
  if (const char* v = std::getenv("DIFFCHECK_GATHER_MAX_MIB"); v && *v) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (*end != '\0' || !std::isdigit(static_cast<unsigned char>(*v)))
      input_error("DIFFCHECK_GATHER_MAX_MIB='{}': a whole number of MiB expected", v);
    mib = n;
  }
  return mib << 20;
}

namespace {

// This rank's tap rows, in bytes.
long long my_tap_bytes(const TapRecorder& taps) {
  long long mine = 0;
  for (const auto& r : taps.records()) mine += static_cast<long long>(r.local.size() * sizeof(float));
  return mine;
}

// The write mode --store asks for (choose_write_mode, which also says it).
WriteMode write_mode_for(const std::string& store, bool shared, bool one_host, long long bytes,
                         std::uint64_t gather_max) {
  const bool small = static_cast<std::uint64_t>(bytes) <= gather_max;
  if (store == "gather" || (store == "auto" && (!shared || small))) return WriteMode::gathered;
  if (store == "pwrite" || (store == "auto" && one_host)) return WriteMode::positional;
  return WriteMode::collective;
}

}  // namespace

// What the run file will hold: the taps' rows and the reference boxes of every rank.
long long bytes_to_write(const Comm& world, const TapRecorder& taps) {
  long long mine = my_tap_bytes(taps);
  for (const auto& [name, part] : taps.references())
    for (const auto& b : part.blocks) mine += static_cast<long long>(b.data.size() * sizeof(double));
  return world.sum_ll(mine);
}

// Refuses a run file the output directory has no room for, before anything
// is written: a disk that fills inside HDF5's closing metadata writes leaves
// its ranks in different collectives (a hang the watchdog would have to
// end), and a clear message is better anyway. Rank 0 asks (it writes a
// gathered file; an MPI-IO file is in a directory every rank shares); every
// rank gets its answer. HDF5's metadata is allowed for: 1 MiB and 1/64.
// DIFFCHECK_NO_ROOM_CHECK=1 skips it (tests of a disk that fills while written).
void require_room_for_run_file(const Comm& world, const std::string& out, long long bytes) {
  if (const char* v = std::getenv("DIFFCHECK_NO_ROOM_CHECK"); v && std::string(v) == "1") return;
  agreed_on_root(world, 0, [&] {
    const std::string dir = std::filesystem::path(out).parent_path().string();
    const std::uint64_t need = static_cast<std::uint64_t>(bytes) + static_cast<std::uint64_t>(bytes) / 64 + (1u << 20);
    const std::uint64_t free = available_bytes(dir.empty() ? "." : dir).value_or(UINT64_MAX);
    if (free < need)
      fail("rank 0: no room for the run file '{}': it needs about {:.1f} MiB, and {} has {:.1f} MiB free; nothing was "
           "written to '{}'",
           out, double(need) / (1 << 20), dir.empty() ? "." : dir, double(free) / (1 << 20), out);
    return std::string();
  });
}

// Every rank writes into the run file only where all write into the same
// file (a directory all hosts share) and the file is not small; else rank 0
// writes it. Ranks on one host write at their offsets (--store pwrite:
// O_DIRECT, 4x the page cache's rate on the VM measured); ranks on several
// hosts through MPI-IO, which keeps their pages coherent.
WriteMode choose_write_mode(const Comm& world, const std::string& store, bool shared, bool one_host, long long bytes,
                            std::uint64_t gather_max) {
  const WriteMode mode = write_mode_for(store, shared, one_host, bytes, gather_max);
  if (world.rank() == 0 && world.size() > 1)
    spdlog::info("output directory {} by all ranks: run file written {} ({:.1f} MiB{})",
                 shared ? "shared" : "NOT shared",
                 mode == WriteMode::gathered     ? "by rank 0 (rows gathered over MPI)"
                 : mode == WriteMode::positional ? "by every rank at its offsets (pwrite)"
                                                 : "with MPI-IO by every rank",
                 double(bytes) / (1 << 20),
                 mode == WriteMode::gathered && shared && store == "auto" ? ", at most DIFFCHECK_GATHER_MAX_MIB: gathered"
                                                                          : "");
  return mode;
}

std::optional<PendingRunFile> begin_run_file_beside_references(const Comm& world, const std::string& out,
                                                               const RunInfo& info, const TapRecorder& taps,
                                                               const std::string& store, bool shared, bool one_host,
                                                               std::uint64_t gather_max, long long& tap_bytes) {
  tap_bytes = world.sum_ll(my_tap_bytes(taps));
  // The whole file is at least its taps: above the gather limit they decide the mode.
  if (static_cast<std::uint64_t>(tap_bytes) <= gather_max ||
      write_mode_for(store, shared, one_host, tap_bytes, gather_max) != WriteMode::positional) {
    tap_bytes = 0;
    return std::nullopt;
  }
  try {
    require_room_for_run_file(world, out, tap_bytes);
    auto begun = begin_run_file(world, out, info, taps);
    if (world.rank() == 0)
      spdlog::info("run file {} begun: the taps' {:.1f} MiB written at every rank's offsets beside the references",
                   out, double(tap_bytes) / (1 << 20));
    return begun;
  } catch (const std::exception& e) {
    // Agreed: every rank is here. Inside the scenario an error would read as
    // its crash; the whole file is written after it instead, as without this.
    if (world.rank() == 0)
      spdlog::warn("could not begin the run file beside the references ({}); it is written after them", e.what());
    tap_bytes = 0;
    return std::nullopt;
  }
}

// The run file's size, counted once (on rank 0).
double run_file_bytes(int rank, const std::string& out) {
  std::error_code ec;
  const auto n = rank == 0 ? std::filesystem::file_size(out, ec) : 0;
  return ec ? 0.0 : double(n);
}

}  // namespace dc
