#include <fmt/format.h>

#include "reference/attention.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "reference/ops.h"
#include "scenarios/flux_pipeline_run.h"

namespace dc::flux_pipeline {

// The initial noise as the run's dtype holds it.
RefTensor PipelineRun::reference_noise() const {
  const ExactInputs exact;  // the reference's own input, never a calibration's perturbed one
  const Place& p = place_;
  Tensor t = ref::generate(ctx_.seed, "noise", {p.dp, p.img, z_.channels}, 1.0f, {{p.b, p.b + 1}, {p.first, p.first + p.rows}, {0, z_.channels}});
  round_to(ctx_.dtype, t.data);  // the input as the run's dtype holds it
  return ref::to_ref(ref::reshape(t, {p.rows, z_.channels}));
}

RefTensor PipelineRun::reference_step(const std::string& step, const RefTensor& x, double sigma, double sigma_next,
                                       bool last) {
  if (ctx_.taps.no_reference()) return {};  // a free run (refused otherwise) never reads them
  // Read from the reference cache: the latents it computed were kept there.
  if (ctx_.taps.references_cached()) return ctx_.taps.kept_reference_value(step + "latents_out");
  const ReferenceClock clock(ctx_.taps);
  if (!w_ref_) w_ref_ = ref::make_pipeline_weights<double>(ctx_.seed, z_, ctx_.dtype);
  const Place& p = place_;
  const ref::Round<double> exact = [](RefTensor&) {};
  const std::function<RefTensor(const RefTensor&)> gather = [&](const RefTensor& mine) {
    Shape s = mine.shape;
    s[0] *= std::size_t(seq_comm_.size());
    return RefTensor(s, seq_comm_.all_gather(std::span<const double>(mine.data)));
  };
  std::vector<RefTensor> v_branch, temb, rel, computed;
  std::vector<std::vector<RefTensor>> blocks;
  const ref::AttendFn<double> attend = [&](std::size_t, const RefTensor& q, const RefTensor& k, const RefTensor& v) {
    return joint_reference_attention(z_.block.txt, q, k, v, gather);
  };
  const auto branches = p.branches();
  for (std::size_t j = 0; j < branches.size(); ++j) {
    const std::size_t br = branches[j];
    // The prompts made afresh here, where generation is exact: the run's own
    // copies carry a calibration's perturbation.
    const RefTensor pooled = ref::to_ref(prompt("pooled", "empty_pooled", br, {z_.block.dim}));
    const RefTensor txt = ref::to_ref(prompt("prompt", "empty_prompt", br, {z_.block.txt, z_.block.dim}));
    // The model receives 1000 sigma as a float32 tensor (see timestep_broadcast).
    const RefTensor tb = ref::pipeline_temb<double>(static_cast<float>(1000.0f * float(sigma)), pooled, *w_ref_, z_, exact);
    temb.push_back(tb);
    // The reference makes its own caching decision (tapped) but follows the
    // sharded run's, so that the steps after stay comparable.
    BranchOptions bo{cache_threshold_, last, computed_.at(j),
                     [&](std::vector<double>& sums) { seq_comm_.all_reduce_sum(std::span<double>(sums)); }};
    auto r = branch_step<double>(x, txt, tb, *w_ref_, z_, rope_, attend, exact, ref_cache_[br], bo);
    v_branch.push_back(std::move(r.v));
    blocks.push_back(std::move(r.block_taps));
    rel.push_back(RefTensor({1}, {r.rel_l1}));
    computed.push_back(RefTensor({1}, {r.decided ? 1.0 : 0.0}));
  }
  put_latents(step + "latents", x);
  put_branches(step + "temb", temb, false);
  if (cache_threshold_ > 0) {
    put_branches(step + "cache/rel_l1", rel, false);
    put_branches(step + "cache/computed", computed, false);
  }
  for (std::size_t k = 0; k < z_.blocks; ++k) {
    if (!ctx_.pipeline.taps_block(k, z_.blocks)) continue;
    put_branches(step + fmt::format("block{}/attn", k), pick(blocks, 3 * k), true);
    put_branches(step + fmt::format("block{}/out", k), pick(blocks, 3 * k + 1), true);
    put_branches(step + fmt::format("block{}/out_txt", k), pick(blocks, 3 * k + 2), false);
  }
  put_branches(step + "v_branch", v_branch, true);
  RefTensor v;
  if (p.cfg == 1) {
    v = ref::cfg_combine<double>(v_branch[0], v_branch[1], z_.guidance, exact);
  } else {
    const auto both = cfg_comm_.all_gather(std::span<const double>(v_branch[0].data));
    const std::size_t n = v_branch[0].size();
    const RefTensor cond(v_branch[0].shape, std::vector<double>(both.begin(), both.begin() + n));
    const RefTensor uncond(v_branch[0].shape, std::vector<double>(both.begin() + n, both.end()));
    v = ref::cfg_combine<double>(cond, uncond, z_.guidance, exact);
  }
  put_latents(step + "v", v);
  RefTensor next = ref::euler_step<double>(x, v, sigma, sigma_next, exact);
  put_latents(step + "latents_out", next);
  ctx_.taps.keep_reference_value(step + "latents_out", next);  // the next step starts from it (forced mode)
  return next;
}

void PipelineRun::reference_final(const RefTensor& x) {
  if (ctx_.taps.references_cached()) return;  // read from the reference cache
  put_latents("final/latents", x);
  put_latents("final/image", ref::latents_to_rgb(x));
}

// The reference boxes: image rows by the rank that holds them (once per CFG
// pair), text rows by rank (0, 0) of ring x sp, each branch by its rank.
void PipelineRun::put_latents(const std::string& name, const RefTensor& x) {
  const Place& p = place_;
  if (p.c != 0) return;
  Shape global{p.dp, p.img};
  global.insert(global.end(), x.shape.begin() + 1, x.shape.end());
  std::vector<std::size_t> start(global.size(), 0);
  start[0] = p.b;
  start[1] = p.first;
  ctx_.taps.reference_block(name, global, std::move(start), ref::with_batch_dim(x));
}

void PipelineRun::put_branches(const std::string& name, const std::vector<RefTensor>& per_branch, bool image_rows) {
  const Place& p = place_;
  if (!image_rows && (p.r != 0 || p.s != 0)) return;
  const auto branches = p.branches();
  for (std::size_t j = 0; j < branches.size(); ++j) {
    const RefTensor& x = per_branch[j];
    Shape global{p.dp, 2, image_rows ? p.img : x.shape[0]};
    global.insert(global.end(), x.shape.begin() + 1, x.shape.end());
    std::vector<std::size_t> start(global.size(), 0);
    start[0] = p.b;
    start[1] = branches[j];
    if (image_rows) start[2] = p.first;
    ctx_.taps.reference_block(name, global, std::move(start), ref::with_batch_dim(ref::with_batch_dim(x)));
  }
}

}  // namespace dc::flux_pipeline
