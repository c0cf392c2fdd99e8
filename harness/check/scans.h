// The comparator's three checks over one chunk of one block, each adding to
// the tap's statistics (check/tap_stats.h): non-finite values, a replica
// against its leader, values against the reference under a tolerance.
#pragma once
#include <cstddef>

#include "harness/capture/activations.h"
#include "harness/check/chunks.h"
#include "harness/check/tap_plan.h"
#include "harness/check/tap_stats.h"
#include "harness/check/tolerance.h"

namespace dc {

// Values as a source stored them (ActivationData::read_piece_stored): float
// (element_size 4) or double (8). Scans widen each element exactly, so their
// results do not depend on the width.
struct StoredValues {
  const void* data = nullptr;
  std::size_t element_size = 8;
};

// Which build of a vector kernel runs: the best the CPU has, or one named (tests).
enum class ScanBuild { best, portable, avx2 };

// `first`: the chunk's first local (flat) index in the rank's piece.
void scan_nonfinite(const double* x, std::size_t n, int rank, std::size_t first, TapStats& s);
void scan_nonfinite(StoredValues x, std::size_t n, int rank, std::size_t first, TapStats& s);
void scan_replica(const double* a, const double* b, std::size_t n, int leader, int rank,
                  std::size_t first, StoredKind kind, TapStats& s);
void scan_reference(const double* x, const double* ref, std::size_t n, const Tolerance& tol,
                    const TapPlan& p, const BlockGroup& g, std::size_t first, const ChunkPlan& plan,
                    TapStats& s);
// Returns whether `x` may hold a NaN or an Inf; false: it holds none, and
// scan_nonfinite on it would find nothing (so it need not run).
bool scan_reference(StoredValues x, StoredValues ref, std::size_t n, const Tolerance& tol, const TapPlan& p,
                    const BlockGroup& g, std::size_t first, const ChunkPlan& plan, TapStats& s,
                    ScanBuild build = ScanBuild::best);
// The two builds scan_reference chooses between (bit-identical results; the
// AVX2 one where the CPU has it), for tests.
void scan_reference_portable(const double* x, const double* ref, std::size_t n, const Tolerance& tol,
                             const TapPlan& p, const BlockGroup& g, std::size_t first, const ChunkPlan& plan,
                             TapStats& s);
void scan_reference_avx2(const double* x, const double* ref, std::size_t n, const Tolerance& tol,
                         const TapPlan& p, const BlockGroup& g, std::size_t first, const ChunkPlan& plan,
                         TapStats& s);
bool scan_reference_avx2_available();

}  // namespace dc
