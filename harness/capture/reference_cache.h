// The reference cache (--reference-cache DIR): a run's float64 references,
// kept on disk so that the next run with the same inputs reads them instead
// of computing them again (a sweep's, a bisection's or the nightly's trials
// differ mostly in faults and flags, rarely in what the reference depends on).
//
// An entry is content-addressed: its key is the text of everything the
// references depend on (the caller's description: scenario, size, seed, input
// dtype, mesh, flags ...) plus the build id of this executable, so neither a
// changed input nor a rebuilt binary ever meets a stale entry. An entry is a
// directory DIR/<hash of key>/ holding one file per rank (each rank keeps the
// boxes it computed and the values its sharded run takes from its reference,
// capture/tap.h): written to a temporary and renamed, so a
// reader sees a whole file or none; the key text is stored in the file and
// compared, and an XXH3 checksum of the file is verified on every read, so a
// damaged entry is recomputed with a warning, never trusted. Concurrent runs
// of one key each rename a whole file: the last one stays. After a store, the
// least recently used entries are removed until DIR holds at most the bound.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "harness/core/comm.h"

namespace dc {

class TapRecorder;

inline constexpr std::uint64_t kDefaultReferenceCacheBytes = 16ull << 30;

struct ReferenceCacheSettings {
  std::string dir;  // empty or "off": no cache
  std::uint64_t max_bytes = kDefaultReferenceCacheBytes;
  bool enabled() const { return !dir.empty() && dir != "off"; }
};

// The cache a run uses when --reference-cache is not given:
// $DIFFCHECK_REFERENCE_CACHE, else results/cache (made absolute, so trial
// children in other directories share it).
std::string default_reference_cache_dir();

// The GNU build id of this executable (hex), or, when it has none, a hash of
// the executable's bytes: part of every key.
const std::string& executable_build_id();

// What a lookup found, for the report and the log.
struct ReferenceCacheOutcome {
  bool hit = false;
  std::string entry;   // DIR/<hash>
  std::string reason;  // why it missed (no entry, damaged on rank R, ...) or "" on a hit
  std::string summary() const;  // one line for the report
};

// The boxes of a hit whose reading was deferred (ReferenceCache::load): the
// rank's file, held open, so that an eviction or a newer entry renamed over
// it in between changes nothing.
class DeferredBoxes {
 public:
  // No MPI. Reads the boxes into `taps`, checking the file again; an Error
  // when it no longer reads whole (it cannot change: writers rename new files).
  void read_into(int rank, TapRecorder& taps);
  bool pending() const { return file_ != nullptr; }

 private:
  friend class ReferenceCache;
  std::shared_ptr<std::FILE> file_;
  std::string key_text_, path_;
};

class ReferenceCache {
 public:
  // `build`: which executable computes the references (tests give others).
  ReferenceCache(ReferenceCacheSettings settings, std::string key_text,
                 const std::string& build = executable_build_id());

  const std::string& entry_dir() const { return entry_; }
  const ReferenceCacheSettings& settings() const { return settings_; }

  // Collective over `world`: every rank reads its file of the entry into
  // `taps` (as reference boxes). True on every rank only when every rank read
  // a whole, checked file of this key; otherwise nothing is left in `taps`
  // and every rank returns false (the references must be computed).
  ReferenceCacheOutcome load(const Comm& world, TapRecorder& taps) const;
  // The same decision, but the boxes (the bulk) are only checked: on a hit
  // `deferred` holds this rank's open file, and DeferredBoxes::read_into
  // reads them later — into memory the scenario has freed by then, where
  // loading first made every box fresh pages (flux1-dev, 4 ranks, 2 cores:
  // a cached run 1-2 s shorter).
  ReferenceCacheOutcome load(const Comm& world, TapRecorder& taps, DeferredBoxes* deferred) const;

  // Writes the boxes this rank holds (no MPI: it may run on a thread beside
  // the run file's write). Failures only warn: the cache is an optimisation,
  // and an entry some rank failed to write is a miss next time.
  void store(int rank, const TapRecorder& taps) const;
  // A text kept under this key (e.g. a calibration's noise floors), with the
  // same key check and checksum; read and written by one process. Empty when
  // absent or damaged (a warning says which).
  std::optional<std::string> load_text(const std::string& name) const;
  void store_text(const std::string& name, const std::string& text) const;

  // Once every rank's store is done (one process, e.g. rank 0): removes least
  // recently used entries beyond the bound, never this one.
  void evict() const;

 private:
  std::string rank_file(int rank) const;
  ReferenceCacheSettings settings_;
  std::string key_text_;
  std::string entry_;
};

// Removes the least recently used entries (directory modification time, which
// a hit refreshes) of `dir` until it holds at most `max_bytes`, keeping
// `keep`. Returns the number removed. Safe against a concurrent evictor.
int evict_reference_cache(const std::string& dir, std::uint64_t max_bytes, const std::string& keep);

}  // namespace dc
