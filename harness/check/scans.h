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

// `first`: the chunk's first local (flat) index in the rank's piece.
void scan_nonfinite(const double* x, std::size_t n, int rank, std::size_t first, TapStats& s);
void scan_replica(const double* a, const double* b, std::size_t n, int leader, int rank,
                  std::size_t first, StoredKind kind, TapStats& s);
void scan_reference(const double* x, const double* ref, std::size_t n, const Tolerance& tol,
                    const TapPlan& p, const BlockGroup& g, std::size_t first, const ChunkPlan& plan,
                    TapStats& s);
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
