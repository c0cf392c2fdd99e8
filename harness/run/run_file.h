// The run file's side of a run (run.cpp): its directories, what an
// interrupted run must remove, its size, the check for room, and how it is
// written (--store). Every function that takes a Comm is collective over it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "harness/capture/store.h"
#include "harness/capture/tap.h"
#include "harness/core/comm.h"

namespace dc {

// What an interrupted run leaves must go with it: the run file's temporary,
// OpenMPI's named semaphore for it, and the watch directory.
void remove_run_file_when_stopped(const std::string& out);

// Every rank makes the run file's directory and the watchdog's beside it.
// Returns the run file's directory.
std::string make_output_directories(const std::string& out);

// --store mpiio and pwrite need a directory every rank writes into: an
// InputError otherwise (before the scenario runs).
void refuse_store_unless_shared(const std::string& out, const std::string& store, bool shared);

// DIFFCHECK_GATHER_MAX_MIB (default 256) in bytes: --store auto gathers run
// files up to this size to rank 0.
std::uint64_t gather_limit_bytes();

// What the run file will hold: the taps' rows and every rank's reference boxes.
long long bytes_to_write(const Comm& world, const TapRecorder& taps);

// Exit 2 on every rank, before anything is written, when the output
// directory has no room for `bytes` (DIFFCHECK_NO_ROOM_CHECK=1 skips it).
void require_room_for_run_file(const Comm& world, const std::string& out, long long bytes);

// The write mode --store asks for, given whether the directory is shared,
// whether every rank runs on one host and the file's size; rank 0 logs it.
WriteMode choose_write_mode(const Comm& world, const std::string& store, bool shared, bool one_host, long long bytes,
                            std::uint64_t gather_max);

// The run file begun beside the references (store.h, begin_run_file), when
// the scenario has said every tap is recorded, the file will be written at
// every rank's offsets (--store pwrite, or auto with one host and a shared
// directory) and its taps alone are above the gather limit: their rows go
// out while the references are computed. Collective. Empty when it does not
// apply, or when the begin failed (a warning; the whole file is then written
// after the references, as without it). `tap_bytes` gets the taps' bytes.
std::optional<PendingRunFile> begin_run_file_beside_references(const Comm& world, const std::string& out,
                                                               const RunInfo& info, const TapRecorder& taps,
                                                               const std::string& store, bool shared, bool one_host,
                                                               std::uint64_t gather_max, long long& tap_bytes);

// The run file's size on rank 0 (0 on the others), for the profile.
double run_file_bytes(int rank, const std::string& out);

}  // namespace dc
