// Run against run (`diffcheck compare RUN_A --against RUN_B`): two sharded
// runs of one computation, on any meshes and layouts, compared with no
// reference. Run B's taps, laid out in global coordinates, stand where a
// reference would; each tap's tolerance is the sum of both runs' bounds, since
// a low-precision run is off the truth by its own rounding and so is the other
// (check/tap_check.cpp sums them). For models that fit on no single device,
// and for "did my activations change?" against yesterday's run (--exact:
// bitwise).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "harness/capture/activations.h"
#include "harness/check/compare.h"
#include "harness/check/tap_plan.h"

namespace dc {

struct AgainstOptions {
  bool exact = false;  // bitwise: every tap held to atol = rtol = 0
};

// Run A's taps, matched by name with run B's: a matched tap's reference is
// B's global tensor. What either run lacks is listed, not fatal.
struct AgainstMatch {
  ActivationSet set;
  std::vector<std::string> only_in_a, only_in_b;
  // Taps whose values depend on the mesh (`per_mesh`: a ring step's partial
  // attention), not compared between runs on different meshes.
  std::vector<std::string> per_mesh;
  // Taps where A holds the first samples of B's larger batch (the runs'
  // batches grow with dp): compared on A's samples.
  std::vector<std::string> fewer_samples;
  std::string describe() const;  // for the report: the runs, the yardstick, the taps left out
};

// Throws InputError naming both runs when they are not of one computation:
// another scenario or dtype, or a tap whose global shapes differ (but for a
// batch, the leading dimension, where A's may be smaller: B's first samples
// are A's, as when a run's batch grows with dp; batch_larger orients a
// pair); and a
// sketch tap matched with a whole one, or with a sketch of another seed or
// row count (sketches compare with sketches: docs/FORMAT.md).
AgainstMatch match_runs(const ActivationSet& a, const ActivationSet& b, const AgainstOptions& options);

// Whether run A holds more samples than run B (the leading dimension of their
// whole taps' global shapes, all other dimensions equal): then B is matched
// against A. Throws InputError when taps differ both ways.
bool batch_larger(const ActivationSet& a, const ActivationSet& b);

// Run B's tap `t` over `slab` of its global tensor: every block that meets
// the slab, from its partial-sum leaders (added in rank order).
void read_global(const ActivationSet& b, const TapData& t, const Slab& slab, double* out);
// The same with the tap's plan made already (plan_tap(t, b.mesh)).
void read_global(const ActivationSet& b, const TapData& t, const TapPlan& plan, const Slab& slab, double* out);

// The same set with no references: each run's own checks (NaN/Inf, replicas).
ActivationSet without_references(const ActivationSet& set);

// The other run's bound on a tap added to this run's: element-wise summed,
// norm-wise (rel L2, column means) in quadrature (a tap held to exactness
// stays exact); nothing for a tap with no other run.
void add_other_runs_bound(const ActivationSet& set, const TapData& t, const CompareOptions& opts, double rms,
                          Tolerance& tol);

}  // namespace dc
