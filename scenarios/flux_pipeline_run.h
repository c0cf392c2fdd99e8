// The run of scenario flux_pipeline (scenarios/flux_pipeline.cpp): the
// sharded denoising loop (flux_pipeline_run.cpp) and, step by step beside it,
// its float64 reference (flux_pipeline_reference.cpp).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "harness/run/scenario.h"
#include "reference/flux_pipeline.h"
#include "scenarios/joint_attention.h"

namespace dc::flux_pipeline {

using ref::PipelineSizes;

// Where this rank sits and what it holds.
struct Place {
  std::size_t dp, cfg, ring, sp;  // mesh sizes
  std::size_t b, c, r, s;         // coordinates
  std::size_t img, rows, first;   // image tokens in all, this rank's, its first
  std::vector<std::size_t> branches() const {  // 0 = conditional, 1 = unconditional
    if (cfg == 2) return {c};
    return {0, 1};
  }
};


// The sizes of a run: the preset, with --steps.
PipelineSizes sizes(const RunContext& ctx);

class PipelineRun {
 public:
  explicit PipelineRun(RunContext& ctx);
  void go();

 private:
  long depth() const { return long(z_.block.dim + z_.block.mlp); }
  std::vector<float> schedule();
  Tensor noise() const;
  Tensor prompt_text(std::size_t branch) const;
  Tensor prompt_pooled(std::size_t branch) const;
  Tensor prompt(const char* cond, const char* uncond, std::size_t branch, Shape s) const;
  double rms(const std::vector<Tensor>& xs) const;
  Tensor guided(std::vector<Tensor>& v);
  // Block k's entry of each branch: `xs` holds, branch after branch, one entry per block.
  template <class T>
  std::vector<BasicTensor<T>> pick(const std::vector<BasicTensor<T>>& xs, std::size_t k) const {
    std::vector<BasicTensor<T>> out;
    for (std::size_t i = k; i < xs.size(); i += z_.blocks) out.push_back(xs[i]);
    return out;
  }
  // Taps. Image rows [dp, I, ...] split over ring x sp; per-branch tensors
  // [dp, 2, ...] split over cfg too; text rows replicated over ring x sp.
  void tap_latents(const std::string& name, const Tensor& x, long depth = 0);
  void tap_branches(const std::string& name, const std::vector<Tensor>& per_branch, long depth, bool image_rows);

  // The reference of step t in float64 for this rank's sample, branches and
  // image rows (the same rows the sharded run holds): the text rows on every
  // rank of ring x sp alike, attention over all tokens by an all-gather of
  // the image keys and values over ring x sp. Returns the next latents.
  RefTensor reference_noise() const;
  RefTensor reference_step(const std::string& step, const RefTensor& x, double sigma, double sigma_next);
  void reference_final(const RefTensor& x);
  void put_latents(const std::string& name, const RefTensor& x);
  void put_branches(const std::string& name, const std::vector<RefTensor>& per_branch, bool image_rows);

  RunContext& ctx_;
  PipelineSizes z_;
  Place place_;
  Comm cfg_comm_, sp_comm_, ring_comm_, seq_comm_;
  ref::PipelineWeights<float> w_;
  std::optional<ref::PipelineWeights<double>> w_ref_;
  ref::RopeTable rope_;
  ref::Round<float> round_;
  JointAttentionOptions opt_;
  bool sendrecv_ = false;
  bool free_ = false;  // --reference-mode free: the run follows its own trajectory
  // The tolerance factor of this step's taps: in free mode the rounding
  // errors of the steps before add up like a random walk, sqrt(t + 1)
  // (docs/flux_pipeline.md has the measurements); 1 in forced mode.
  double growth_ = 1.0;
  std::vector<double> ref_sigmas_;
};

}  // namespace dc::flux_pipeline
