// Subsystem capture (harness/capture/, library diffcheck_capture), on core.
// Owns what is recorded and how it is kept: the TapRecorder scenarios feed,
// the ActivationSet model of a run's taps, and this store. Nothing above it
// touches HDF5; nothing in it judges values.
//
// The only part of diffcheck that calls HDF5. Writes run files (form 1 of the
// activation format, with parallel HDF5 and collective writes) and reads run
// files and per-rank files (form 2) into an ActivationSet.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "harness/capture/activations.h"
#include "harness/core/comm.h"
#include "harness/capture/tap.h"

namespace dc {

struct RunInfo {
  std::string scenario;
  std::string flags;
  std::string dtype;
  std::uint64_t seed = 0;
  std::string producer;
  std::string size;  // the scenario's size preset (optional root attribute `size`)
};

// How a run file is written: `collective`, every rank writes its rows and
// reference boxes with parallel HDF5 (MPI-IO) — the directory must be the same
// for every rank; `gathered`, rank 0 writes the file alone and the others send
// it their rows and boxes over MPI, one piece of at most kGatherElements at a
// time — for directories each host has its own of (node-local /tmp);
// `positional`, rank 0 lays the file out and every rank writes its rows and
// boxes at their offsets with pwrite, past the page cache where the
// filesystem allows (store_positional.cpp) — for ranks all on one host.
enum class WriteMode { collective, gathered, positional };
inline constexpr std::size_t kGatherElements = std::size_t{4} << 20;

// Collective over `world`. Writes to "<path>.tmp" and renames when complete, so
// `path` either is whole or is not there. Every rank must have recorded the
// same taps with the same shapes and layouts; otherwise an Error names the
// first tap that differs. `created` (a testing aid, --chaos ...:during=write)
// runs on each rank once "<path>.tmp" exists, or as it starts to send its
// rows when rank 0 writes alone.
void write_run_file(const Comm& world, const std::string& path, const RunInfo& info,
                    const TapRecorder& taps, WriteMode mode = WriteMode::collective,
                    const std::function<void()>& created = {});

class PositionalWrites;

// write_run_file in two steps, so that the caller can go on while the bytes
// go out: start_run_file() does every collective step of the write; under
// WriteMode::positional this rank's rows and boxes are then written on a
// thread of its own (no MPI, the taps only read), beside whatever the caller
// does next — the in-memory check needs no file. finish() (collective) waits
// for them, ends every rank alike when any rank's writes failed, and renames
// the file into place. Destroyed unfinished (an error in between), it waits
// for the thread and leaves no file. `taps` must outlive it.
class PendingRunFile {
 public:
  PendingRunFile(const Comm& world, std::string path, std::unique_ptr<PositionalWrites> writes);
  PendingRunFile(PendingRunFile&&) noexcept;
  ~PendingRunFile();
  void finish();
  // Seconds this rank's writes took on their threads (0 when written before
  // start_run_file returned); known after finish().
  double background_seconds() const { return background_s_; }
  // A second part's writes (start_run_file of a begun file).
  void add(std::unique_ptr<PositionalWrites> writes);

 private:
  const Comm* world_;
  std::string path_;
  std::vector<std::unique_ptr<PositionalWrites>> writes_;
  bool finished_ = false;
  double background_s_ = 0;
};

// A run file begun before its references exist (WriteMode::positional only):
// once the scenario has recorded every tap, begin_run_file() agrees on the
// taps, lays out the file's header and tap datasets, and writes this rank's
// rows on a thread, beside the references being computed. start_run_file()
// given the begun file adds the reference datasets and writes the boxes;
// its taps must not change in between (TapRecorder::all_taps_recorded).
PendingRunFile begin_run_file(const Comm& world, const std::string& path, const RunInfo& info,
                              const TapRecorder& taps);

PendingRunFile start_run_file(const Comm& world, const std::string& path, const RunInfo& info,
                              const TapRecorder& taps, WriteMode mode = WriteMode::collective,
                              const std::function<void()>& created = {}, PendingRunFile* begun = nullptr);

// `source` is a run file, one rank file, or the prefix of rank files
// (`<prefix>.rank<R>.h5`). `reference_path`, when not empty, is a separate file
// holding /reference datasets. Throws InputError naming the file, tap and
// attribute when the input does not follow the format. `split_like`: the
// stream splits of another set of the same computation, applied to this one's
// taps of those names that have no `streams` of their own (a one-device run).
ActivationSet read_activations(const std::string& source, const std::string& reference_path = "",
                               const std::map<std::string, StreamSplit>* split_like = nullptr);

}  // namespace dc
