// Subsystem check (harness/check/, library diffcheck_check), on capture and
// core. Owns the verdict: tolerances, this comparator, the console and JSON
// reporters, and the compare command (read, check, report). It knows nothing
// of scenarios or of the search that drives runs.
//
// The checks of the activation format, per tap in order: non-finite values,
// replica agreement, agreement with the reference; and the first divergence.
// Mismatches are data (counts, maxima, indices), never exceptions.
//
// Streaming: each tap is walked in chunks (ChunkPlan) per block of the global
// tensor — the block's partial-sum leaders and their replicas read chunk by
// chunk, summed in float64 in rank order, compared with the same chunk of the
// reference — so memory is bounded by the budget whatever the tensor size, and
// every statistic comes out of one pass (a second pass over the reference only
// when the tolerance needs its RMS). Items (chunk x block) run on all cores.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "harness/capture/activations.h"
#include "harness/check/tolerance.h"
#include "harness/core/comm.h"

namespace dc {

struct CompareOptions {
  std::optional<double> atol, rtol;  // override the derived defaults
  // Measured per-tap tolerances (--tolerances FILE, a calibration, a noise
  // floor); taps it does not name keep the derived rule. Null: none.
  const ToleranceTable* tolerances = nullptr;
  // Measure noise floors (check/noise_floor.h): every tap at rtol 1, atol
  // rms(ref), its own tolerance attributes set aside.
  bool measure_floor = false;
  long replica_ulps = 0;             // allowed ULP distance between replicas
  // Bytes the whole process may use; the chunk buffers get what is left after
  // a fixed allowance for the program itself (kProcessAllowance).
  std::size_t memory_budget = std::size_t{128} << 20;
  int threads = 0;  // 0: one per core
  std::size_t chunk_elements = 0;  // 0: derived from the budget; tests force tiny chunks
  // Elements per summation unit of the rel L2 and RMS sums: fixed, so the
  // sums do not depend on chunks, threads or processes. Chunks are never
  // smaller; tests that force tiny chunks set 1 too.
  std::size_t sum_unit = 4096;
  // Processes that share the work (`mpirun -n K diffcheck compare`): each
  // checks its share of every tap's chunks and the statistics are merged, so
  // every process gets the same result as one process alone. Null: alone.
  const Comm* processes = nullptr;
  // A tap with no reference to be compared with, in a run that has one, is a
  // failure (--require-reference) rather than "unchecked".
  bool require_reference = false;
};

inline constexpr std::size_t kProcessAllowance = std::size_t{48} << 20;

// Elements per chunk buffer for `threads` threads under `budget` bytes (each
// thread holds four float64 buffers). Never below 4096.
std::size_t chunk_elements(std::size_t budget, int threads);

struct ElementRef {
  int rank = -1;                   // owning rank (lowest of its replica group)
  std::vector<std::size_t> index;  // local index for per-rank checks, global for reference
};

struct NonFinite {
  long long nan = 0, inf = 0;
  std::optional<ElementRef> first_nan, first_inf;
  std::vector<int> ranks;  // ranks holding any non-finite value
};

struct ReplicaCheck {
  bool applies = false;        // some replica group has more than one rank
  double max_abs = 0;
  long long max_ulp = 0;
  int leader = -1, other = -1;  // the pair with the largest difference
  std::vector<std::size_t> index;
  double leader_value = 0, other_value = 0;
  std::vector<std::string> axes;  // replica axes along which differing ranks sit ("across dp")
  std::vector<int> differing;   // ranks whose piece differs from their group leader
  bool by_hash = false;         // a sketch tap: told by hashes of the bits, no element or ULP figure
  bool pass = true;
};

// The largest of a tap's element-wise, norm-wise and column-mean err/tol
// ratios (> 1 fails; a NaN wins, as it fails).
inline double largest_ratio(double worst, std::optional<double> l2, std::optional<double> column) {
  double m = worst;
  for (const auto& r : {l2, column})
    if (r && !(*r <= m)) m = *r;
  return m;
}

struct ReferenceCheck {
  bool present = false;
  bool other_run = false;  // the "reference" is another run's tap (compare --against): no reference was used
  Tolerance tol;
  double max_abs = 0, max_rel = 0, rel_l2 = 0;
  long long n_fail = 0, n_total = 0;
  ElementRef worst;       // largest |x-ref| / (atol + rtol|ref|)
  double worst_value = 0, worst_reference = 0;
  double worst_ratio = 0;  // |x-ref| / (atol + rtol|ref|) at the worst element; > 1 fails
  // rel_l2 / tol.rel_l2_limit when the tolerance has a norm-wise limit; > 1 fails
  std::optional<double> l2_ratio;
  // The column-mean error (check/column_error.h), measured when a noise
  // floor is measured or the tolerance limits it; and its ratio to the limit.
  std::optional<double> column_mean, column_ratio;
  // A sketch tap (check/sketch_check.h): rel_l2 and the reference's RMS are
  // estimates, good to within +-`estimate_bound` (relative, 99%); column
  // means are exact; there is no element-wise figure (max_abs, max_rel and
  // the worst element are NaN / absent).
  bool estimated = false;
  double estimate_bound = 0;
  // The largest of the element-wise, norm-wise and column-mean ratios: > 1 fails.
  double margin() const { return largest_ratio(worst_ratio, l2_ratio, column_ratio); }
  std::vector<int> worst_ranks;  // every rank contributing to the worst element
  // Every rank whose own block has an element outside the tolerance (its
  // element-wise err/tol > 1), not only the worst one's: a ring fault on ranks 2 and 3.
  std::vector<int> failing_ranks;
  // The reference's shape, where it is not the tap's global shape: the check
  // fails ("shape") with no element figures (a fault that changed a shape).
  std::optional<Shape> mismatched_shape;
  // How the reference is stored where it is no wider than float64's
  // ("float32": a model that computes its reference in its own dtype); empty
  // for a float64 reference. Reports say so at the tap.
  std::string narrow_reference;
  bool pass = true;
};

// Every rank's share of a tap's checks (index = rank), for reports that show
// all ranks (the HTML heatmap): its non-finite count; its largest |difference|
// to its replica leader (0 when equal, +inf for a NaN difference); the worst
// err/tol over the block of the global tensor it holds (every rank of a
// partial-sum or replica group gets its group's; empty without a reference).
struct PerRank {
  std::vector<long long> nonfinite;
  std::vector<double> replica_diff;
  std::vector<double> err_over_tol;
};

struct TapVerdict {
  std::string name;
  std::string layout;
  std::string dtype;
  Shape local_shape, global_shape;
  NonFinite nonfinite;
  ReplicaCheck replica;
  ReferenceCheck reference;
  PerRank ranks;
  double seconds = 0;  // this process's time checking the tap (JUnit; not in JSON: it varies)
  std::string stage;      // a pipeline stage's tap: "pp=1" (its `stage` attribute), else empty
  long microbatches = 0;  // its `microbatches` attribute: the piece's first dimension holds these in order
  std::vector<long> wrong_microbatches;  // of a tap failing against its reference (check/microbatches.h)
  // A tap with no batch dimension whose microbatches' copies differ (the
  // capture's `microbatch_copies_differ`): "rank 2: microbatches 1,3", one per rank.
  std::vector<std::string> microbatch_copies_differ;
  // The microbatch an element is in (0-based), from its index (global, as the
  // reference's worst; else local, as a rank's); -1 when the tap has none.
  long microbatch_of(const std::vector<std::size_t>& index, bool global) const;
  // In a run that has a reference, a tap with none to be compared with (no
  // reference tap of its name): never a pass. Its non-finite and replica
  // checks still run; it fails only when `unchecked_fails` (--require-reference).
  bool unchecked = false;
  bool unchecked_fails = false;
  bool pass() const {
    return nonfinite.nan == 0 && nonfinite.inf == 0 && replica.pass && reference.pass &&
           !(unchecked && unchecked_fails) && microbatch_copies_differ.empty();
  }
  // Every check that ran passed, and the reference check ran (or the run has no reference).
  bool passed_every_check() const { return pass() && !unchecked; }
  std::vector<std::string> failed_checks() const;
};

// An image tap's item judged as image gates judge a pipeline's output
// (check/images.h): PSNR and SSIM against the reference, and the verdict of
// xDiT's gate (SSIM >= 0.80 and PSNR >= 15), shown, never deciding the exit.
inline constexpr double kGateSsim = 0.80, kGatePsnr = 15.0;
struct ImageVerdict {
  std::string tap;
  std::size_t item = 0;                  // batch index
  std::size_t height = 0, width = 0, channels = 0;
  double data_range = 1;                 // 1 for images in [0, 1], 255 in [0, 255], else the reference's span
  double data_low = 0;                   // where that range starts: 0, or the reference's minimum
  double psnr = 0, ssim = 0;
  bool gate_pass = false;
  std::vector<double> image, reference;  // [H, W, C] row-major, for pictures
};

struct CompareResult {
  std::vector<TapVerdict> taps;
  // Taps with a reference that the tolerance table does not name (they keep
  // the derived rule; the report warns).
  std::vector<std::string> tolerance_fallbacks;
  std::optional<std::size_t> first_divergence;  // index into taps
  // Phases of the run that produced the result, in seconds (run reports
  // only; JSON "timings"): e.g. sharded_s, reference_s, write_s, check_s.
  std::vector<std::pair<std::string, double>> timings;
  std::string reference_source;  // run reports only: "reference: from the cache (...)" or "... computed ..."
  // compare only: which yardstick the tolerances came from when no option
  // named one (a one-device run found beside the reference, or the derived
  // rule and how to measure instead); console line and JSON "tolerance_note".
  std::string tolerance_note;
  std::vector<std::pair<std::string, double>> profile;  // run reports with --profile (run/profile.h)
  // Taps marked as images, judged on the first process (empty elsewhere).
  std::vector<ImageVerdict> images;
  bool pass() const { return !first_divergence.has_value(); }
  // The taps not checked against the reference (TapVerdict::unchecked), in order.
  std::vector<std::string> unchecked_taps() const;
};

CompareResult compare(const ActivationSet& set, const CompareOptions& opts);

// A tap's verdict before any check: its name, layout, dtype, shapes, stage
// and microbatches (whole and sketch taps alike).
TapVerdict blank_verdict(const TapData& t, const Shape& global);

// Holds a reference check to its whole-tensor limits (the tolerance's rel L2
// and column-mean limits, on ref.rel_l2 and ref.column_mean as measured or
// estimated): the ratios, the verdict, and with charge_every_rank (no figures
// of each block's own: a sketch tap) every rank's err/tol raised to them.
void judge_whole_tensor(ReferenceCheck& ref, std::vector<double>& err_over_tol, bool charge_every_rank = true);

// What a tap's tolerance is derived from: its attributes, the options, the
// run's math and the tolerance table (shared by whole and sketch taps).
ToleranceInputs tap_tolerance_inputs(const ActivationSet& set, const TapData& t, const CompareOptions& opts);

// ULP distance between two values as stored in `kind`.
long long ulp_distance(double a, double b, StoredKind kind);

}  // namespace dc
