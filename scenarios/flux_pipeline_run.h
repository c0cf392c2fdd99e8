// The run of scenario flux_pipeline (scenarios/flux_pipeline.cpp): the
// sharded denoising loop (flux_pipeline_run.cpp) and, step by step beside it,
// its float64 reference (flux_pipeline_reference.cpp).
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/run/scenario.h"
#include "reference/flux_pipeline.h"
#include "scenarios/flux_pipeline_branch.h"
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
// Refuses (InputError) a mesh on which the final latents cannot be decoded in strips.
void check_decode_mesh(const Place& p, const PipelineSizes& z);

class PipelineRun {
 public:
  explicit PipelineRun(RunContext& ctx);
  void go();

 private:
  long depth() const { return long(z_.block.dim + z_.block.mlp); }
  std::vector<float> schedule();
  Tensor noise() const;
  // A branch's prompt embedding [T, d] and pooled embedding [d], made once.
  const Tensor& prompt_text(std::size_t branch) const { return text_.at(branch); }
  const Tensor& prompt_pooled(std::size_t branch) const { return pooled_.at(branch); }
  Tensor prompt(const char* cond, const char* uncond, std::size_t branch, Shape s) const;
  double rms(const std::vector<Tensor>& xs) const;
  Tensor guided(std::vector<Tensor>& v);
  // Entry k of each branch's list.
  template <class T>
  static std::vector<BasicTensor<T>> pick(const std::vector<std::vector<BasicTensor<T>>>& per_branch, std::size_t k) {
    std::vector<BasicTensor<T>> out;
    for (const auto& xs : per_branch) out.push_back(xs.at(k));
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
  RefTensor reference_step(const std::string& step, const RefTensor& x, double sigma, double sigma_next, bool last);
  void reference_final(const RefTensor& x);
  // Flag vae_decode: the final latents through the patch-parallel VAE decoder
  // (flux_pipeline_decode.cpp).
  void decode_final(const Tensor& x, const RefTensor& x_ref);
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
  bool decode_ = false;  // flag vae_decode
  // The tolerance factor of this step's taps: in free mode the rounding
  // errors of the steps before add up like a random walk, sqrt(t + 1)
  // (docs/flux_pipeline.md has the measurements); 1 in forced mode.
  double growth_ = 1.0;
  std::vector<double> ref_sigmas_;
  std::map<std::size_t, Tensor> text_, pooled_;  // per branch this rank runs
  double cache_threshold_ = 0;              // flag cache_threshold (0: no step caching)
  BranchCache<float> cache_[2];             // per branch (0 conditional, 1 unconditional)
  BranchCache<double> ref_cache_[2];
  std::vector<bool> computed_;              // the sharded run's decisions this step, per branch held
};

}  // namespace dc::flux_pipeline
