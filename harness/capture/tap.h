// The tap recorder: what a scenario calls to capture a named tensor with its
// layout. Records keep execution order. References (each tap's GLOBAL tensor,
// in float64) are kept by the ranks that compute them: a whole reference on
// the reference rank, or boxes of it (independent samples, token rows) spread
// over the ranks, so the references of a run are computed in parallel.
#pragma once
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/core/comm.h"
#include "harness/core/dtype.h"
#include "harness/core/layout.h"
#include "harness/core/mesh.h"
#include "harness/core/perturbation.h"
#include "harness/core/tensor.h"
#include "harness/core/work_counter.h"

namespace dc {

struct TapOptions {
  Layout layout;                   // default: replicated over the whole mesh
  long reduction_depth = 0;        // terms summed into each element; 0 = not stated
  std::optional<double> atol;      // per-tap tolerance overrides
  std::optional<double> rtol;
  // A factor on the derived tolerance (not on atol/rtol given outright), for
  // taps whose inputs carry the error of earlier steps: a free-running
  // pipeline's step t. 1 = none.
  double tolerance_factor = 1.0;
  // Marks the tap as images, for PSNR/SSIM against the reference in the
  // reports: "nhwc" ([B, H, W, C]), "nchw" ([B, C, H, W]) or "patches:H,W" ([B, H W, p, p, C], the
  // per-token patches of an H x W token grid). Empty: not an image.
  std::string image;
  // What the tap holds depends on the mesh (a ring step's attention over one
  // block of keys): a one-device run computes something else under the same
  // name, so its error is no yardstick for this tap's (check/noise_floor.h).
  bool per_mesh = false;
  // A pipeline stage's tap: its local tensor's first dimension holds this many
  // microbatches laid together in order (the `microbatches` attribute); 0: none.
  // Which stage holds it is the layout's (Layout::stage_axis, stage_index).
  long microbatches = 0;
};

// A box of a reference: `data` (its shape is the box's extent) placed at
// `start` of the whole reference (all of it for a scalar).
struct ReferenceBlock {
  std::vector<std::size_t> start;
  RefTensor data;
};

struct ReferencePart {
  Shape global;                        // the whole reference's shape
  std::vector<ReferenceBlock> blocks;  // what this rank holds, in order of start
};

struct TapRecord {
  std::string name;
  Tensor local;
  TapOptions opts;
  int order = 0;
};

class TapRecorder {
 public:
  TapRecorder(Mesh mesh, int rank, DType dtype, int reference_rank = 0);

  // Capture this rank's piece of tap `name`. Every rank must record the same
  // taps in the same order with the same local shapes. Taken by value: a
  // tensor the scenario is done with moves in (at flux1-dev size a copy costs
  // new pages, the dearest thing on a VM: docs/usage.md, "Memory").
  void tap(const std::string& name, Tensor local, TapOptions opts = {});

  // The single-rank reference of a tap; kept only on the reference rank.
  bool is_reference_rank() const { return rank_ == reference_rank_; }
  void reference(const std::string& name, const RefTensor& global);

  // The rows of an `n`-row reference this rank computes: row r on rank
  // r % world, so samples are computed in parallel. Every rank calls
  // reference_rows for each of its rows of each such tap; together the ranks
  // must cover every row once (the store checks).
  std::vector<std::size_t> my_reference_rows(std::size_t n) const;
  void reference_rows(const std::string& name, const Shape& global, std::size_t first_row,
                      const RefTensor& rows);
  // Row `row` of an `n`-row reference whose rows have the shape of `item`.
  void reference_row(const std::string& name, std::size_t n, std::size_t row, const RefTensor& item);
  // Any box of a reference (e.g. sample b, tokens [t0, t1) of [B, N, d]): the
  // ranks' boxes together must cover it once.
  void reference_block(const std::string& name, const Shape& global, std::vector<std::size_t> start,
                       RefTensor block);

  // Seconds this rank spent computing references, so a run can report the
  // sharded block's own time apart: scenarios compute their references in
  // the scope of a ReferenceClock.
  double reference_seconds() const { return reference_seconds_; }
  // Called after each tap is recorded (the run's --chaos faults hook here).
  void on_tap(std::function<void(const std::string&)> f) { on_tap_ = std::move(f); }
  // The scenario has recorded every tap, and its references (if it computes
  // them) are still to come: the run may write the taps beside them
  // (run/early_write.h). A tap recorded after this is an error. Every rank
  // calls it at the same point (the hook is collective).
  void all_taps_recorded();
  void on_all_taps_recorded(std::function<void()> f) { on_all_taps_recorded_ = std::move(f); }
  void add_reference_seconds(double s) { reference_seconds_ += s; }

  // The references came from the reference cache (capture/reference_cache.h):
  // the scenario must skip computing them (its reference code starts with
  // `if (ctx.taps.references_cached()) return;`), and recording one more
  // is an error that names the scenario's missing check.
  bool references_cached() const { return references_cached_; }
  void set_references_cached(bool cached) { references_cached_ = cached; }
  // --no-reference: the run computes no references at all (a model that fits
  // on no single device; its run is compared with other runs, `diffcheck
  // compare --against`). The scenario's reference code is skipped as for
  // cached references, and values kept from a reference are not there:
  // scenarios that need them (a forced pipeline) refuse the option first.
  bool no_reference() const { return no_reference_; }
  void set_no_reference() { no_reference_ = references_cached_ = true; }

  // Values of this rank's reference that its sharded run needs (a forced
  // pipeline starts each step from the reference's latents): kept beside the
  // references in the reference cache, so a run that reads its references
  // from there has them too; never written to the run file. Kept by the
  // scenario's reference code, read back (by name) when the references were
  // cached; a name kept twice or read but never kept is an error naming it.
  void keep_reference_value(const std::string& name, RefTensor value);
  const RefTensor& kept_reference_value(const std::string& name) const;
  const std::map<std::string, RefTensor>& kept_reference_values() const { return kept_; }

  // FLOPs of the GEMMs this rank ran for references (core/work_counter.h),
  // counted like reference_seconds.
  double reference_flops() const { return reference_flops_; }
  void add_reference_flops(double f) { reference_flops_ += f; }

  const std::vector<TapRecord>& records() const { return records_; }
  const std::map<std::string, ReferencePart>& references() const { return references_; }
  const Mesh& mesh() const { return mesh_; }
  DType dtype() const { return dtype_; }
  int rank() const { return rank_; }

 private:
  Mesh mesh_;
  int rank_;
  DType dtype_;
  int reference_rank_;
  std::vector<TapRecord> records_;
  std::map<std::string, ReferencePart> references_;
  std::map<std::string, RefTensor> kept_;
  double reference_seconds_ = 0;
  double reference_flops_ = 0;
  bool references_cached_ = false;
  bool no_reference_ = false;
  std::function<void(const std::string&)> on_tap_;
  std::function<void()> on_all_taps_recorded_;
  bool all_recorded_ = false;
};

// The scope in which a scenario computes references: timed (the run reports
// the sharded block's time apart) and exact (a calibration's perturbation of
// generated inputs stays out of it: core/perturbation.h).
class ReferenceClock {
 public:
  explicit ReferenceClock(TapRecorder& taps)
      : taps_(taps), t0_(std::chrono::steady_clock::now()), flops0_(work::gemm_flops(true) + work::gemm_flops(false)) {}
  ~ReferenceClock() {
    taps_.add_reference_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
    taps_.add_reference_flops(work::gemm_flops(true) + work::gemm_flops(false) - flops0_);
  }
  ReferenceClock(const ReferenceClock&) = delete;
  ReferenceClock& operator=(const ReferenceClock&) = delete;

 private:
  TapRecorder& taps_;
  std::chrono::steady_clock::time_point t0_;
  double flops0_;
  ExactInputs exact_;
};

// A reference box and the rank that holds it.
struct HeldBox {
  int rank = 0;
  std::vector<std::size_t> start;
  Shape shape;
};

// Where every rank's reference boxes are, per tap, each rank's in the order it
// holds them. Collective over `world` (one all-gather of a few lines per rank).
std::map<std::string, std::vector<HeldBox>> all_reference_boxes(const Comm& world, const TapRecorder& taps);

// Tap names are paths below /taps: non-empty parts separated by '/'.
void validate_tap_name(const std::string& name);

}  // namespace dc
