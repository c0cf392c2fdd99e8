#include "scenarios/flux_pipeline_run.h"

#include <fmt/format.h>

#include <cmath>

#include "harness/check/tolerance.h"
#include "harness/core/error.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "reference/ops.h"
#include "reference/timestep.h"

namespace dc::flux_pipeline {
namespace {

Place place(const RunContext& ctx, const PipelineSizes& z) {
  const auto c = ctx.mesh.coords(ctx.world.rank());
  Place p{std::size_t(ctx.mesh.axis_size("dp")), std::size_t(ctx.mesh.axis_size("cfg")),
          std::size_t(ctx.mesh.axis_size("ring")), std::size_t(ctx.mesh.axis_size("sp")),
          std::size_t(c[0]), std::size_t(c[1]), std::size_t(c[2]), std::size_t(c[3]), 0, 0, 0};
  p.img = z.block.img_h * z.block.img_w;
  p.rows = p.img / (p.ring * p.sp);
  p.first = (p.r * p.sp + p.s) * p.rows;
  return p;
}

// RoPE rows of [text | this rank's image block].
ref::RopeTable rope_rows(const PipelineSizes& z, const Place& p) {
  std::vector<std::size_t> tokens;
  for (std::size_t i = 0; i < z.block.txt; ++i) tokens.push_back(i);
  for (std::size_t i = 0; i < p.rows; ++i) tokens.push_back(z.block.txt + p.first + i);
  return ref::flux_rope_rows(z.block, tokens);
}

}  // namespace

PipelineSizes sizes(const RunContext& ctx) {
  PipelineSizes z = PipelineSizes::preset(ctx.size);
  if (ctx.pipeline.steps > 0) z.steps = ctx.pipeline.steps;
  return z;
}

PipelineRun::PipelineRun(RunContext& ctx)
    : ctx_(ctx),
      z_(sizes(ctx)),
      place_(place(ctx, z_)),
      cfg_comm_(ctx.world.split(ctx.mesh, {"cfg"})),
      sp_comm_(ctx.world.split(ctx.mesh, {"sp"})),
      ring_comm_(ctx.world.split(ctx.mesh, {"ring"})),
      seq_comm_(ctx.world.split(ctx.mesh, {"ring", "sp"})),
      w_(ref::make_pipeline_weights<float>(ctx.seed, z_, ctx.dtype)),
      rope_(rope_rows(z_, place_)),
      round_([dtype = ctx.dtype](Tensor& t) { round_to(dtype, t.data); }) {
  opt_.ulysses.chunks = static_cast<std::size_t>(std::max(0L, ctx.flags.get_int("ulysses_chunks")));
  opt_.ulysses.async = ctx.flags.get_bool("async_a2a");
  opt_.ulysses.dtype = ctx.dtype;
  ulysses_head_chunks(z_.block.heads, place_.sp, opt_.ulysses.chunks);  // validates before any collective
  const std::string transfer = ctx.flags.get_string("kv_transfer"), merge = ctx.flags.get_string("merge");
  const std::string combine = ctx.flags.get_string("cfg_combine");
  if (transfer != "p2p" && transfer != "allgather")
    input_error("kv_transfer must be p2p or allgather (got '{}')", transfer);
  if (merge != "sigmoid" && merge != "maxexp") input_error("merge must be sigmoid or maxexp (got '{}')", merge);
  if (combine != "allgather" && combine != "sendrecv")
    input_error("cfg_combine must be allgather or sendrecv (got '{}')", combine);
  sendrecv_ = combine == "sendrecv";
  free_ = ctx.pipeline.reference_mode == "free";
  decode_ = ctx.flags.get_bool("vae_decode");
  if (decode_) check_decode_mesh(place_, z_);
  opt_.ring.overlap = ctx.flags.get_bool("ring_overlap");
  opt_.ring.allgather = transfer == "allgather";
  opt_.ring.sigmoid_merge = merge == "sigmoid";
  opt_.ring.dtype = ctx.dtype;
  opt_.fault_text_kv_rotated = ctx.injected("text_kv_rotated");
  opt_.fault_scale = ctx.fault_scale;
  for (std::size_t br : place_.branches()) {
    text_[br] = prompt("prompt", "empty_prompt", br, {z_.block.txt, z_.block.dim});
    pooled_[br] = prompt("pooled", "empty_pooled", br, {z_.block.dim});
  }
  const std::string threshold = ctx.flags.get_string("cache_threshold");
  try {
    std::size_t used = 0;
    cache_threshold_ = std::stod(threshold, &used);
    if (used != threshold.size() || !(cache_threshold_ >= 0) || !std::isfinite(cache_threshold_)) throw std::invalid_argument("");
  } catch (const std::logic_error&) {
    input_error("cache_threshold must be a number >= 0 (0: no step caching), got '{}'", threshold);
  }
}

void PipelineRun::go() {
  const std::vector<float> sigmas = schedule();
  const Place& p = place_;
  Tensor x = noise();
  RefTensor x_ref = reference_noise();
  const std::vector<std::size_t> mine = p.branches();
  for (int t = 0; t < z_.steps; ++t) {
    const std::string step = fmt::format("step{:02d}/", t);
    growth_ = free_ ? std::sqrt(double(t) + 1.0) : 1.0;
    tap_latents(step + "latents", x);
    // Forced mode: from step 1 on, the step starts from the reference's latents.
    if (t > 0 && !free_) {
      x = ref::cast<float>(x_ref);
      round_(x);
    }
    const double sigma = sigmas[t], sigma_next = sigmas[t + 1];
    // The sharded step.
    std::vector<Tensor> v_branch, temb, rel, computed;
    std::vector<std::vector<Tensor>> blocks;  // per branch: attn, out, out_txt of each block
    computed_.clear();
    const ref::AttendFn<float> attend = [&](std::size_t, const Tensor& q, const Tensor& k, const Tensor& v) {
      return joint_usp_attention(sp_comm_, ring_comm_, z_.block.txt, q, k, v, opt_);
    };
    BranchOptions bo{cache_threshold_, t + 1 == z_.steps, {}, {}};
    if (!ctx_.injected("per_rank_cache_decision"))
      bo.reduce = [&](std::vector<double>& sums) { seq_comm_.all_reduce_sum(std::span<double>(sums)); };
    for (std::size_t br : mine) {
      const Tensor &pooled = prompt_pooled(br), &txt = prompt_text(br);
      Tensor tb = ref::pipeline_temb<float>(static_cast<float>(1000.0f * float(sigma)), pooled, w_, z_, round_);
      temb.push_back(tb);
      auto r = branch_step<float>(x, txt, tb, w_, z_, rope_, attend, round_, cache_[br], bo);
      v_branch.push_back(std::move(r.v));
      blocks.push_back(std::move(r.block_taps));
      rel.push_back(Tensor({1}, {static_cast<float>(r.rel_l1)}));
      computed.push_back(Tensor({1}, {r.decided ? 1.0f : 0.0f}));
      computed_.push_back(r.decided);
    }
    tap_branches(step + "temb", temb, 1, false);
    if (cache_threshold_ > 0) {
      // The decisions are exact. The change statistic is a ratio of sums whose
      // terms each carry a relative rounding of the dtype: its relative error
      // is of that order (measured: 0.6 u in bfloat16, 1.1 u in float32).
      const double u = unit_roundoff(dtype_name(ctx_.dtype));
      ctx_.taps.tap(step + "cache/rel_l1", ref::with_batch_dim(ref::stack(rel)),
                    {.layout = Layout::parse("dp,cfg", ""), .atol = 0.0, .rtol = growth_ * kToleranceScale * u});
      ctx_.taps.tap(step + "cache/computed", ref::with_batch_dim(ref::stack(computed)),
                    {.layout = Layout::parse("dp,cfg", ""), .atol = 0.0, .rtol = 0.0});
    }
    for (std::size_t k = 0; k < z_.blocks; ++k) {
      if (!ctx_.pipeline.taps_block(k, z_.blocks)) continue;
      tap_branches(step + fmt::format("block{}/attn", k), pick(blocks, 3 * k), z_.block.tokens(), true);
      tap_branches(step + fmt::format("block{}/out", k), pick(blocks, 3 * k + 1), depth(), true);
      tap_branches(step + fmt::format("block{}/out_txt", k), pick(blocks, 3 * k + 2), depth(), false);
    }
    tap_branches(step + "v_branch", v_branch, depth(), true);
    const Tensor v = guided(v_branch);
    // The guided velocity carries each branch's error times |1 - g| and g:
    // its atol is theirs scaled so, on the branches' RMS (the guided
    // velocity itself can be much smaller than the branches it subtracts).
    const double branch_atol =
        derive_tolerance({dtype_name(ctx_.dtype), depth(), {}, {}, {}, {}, rms(v_branch)}).atol;
    ctx_.taps.tap(step + "v", ref::with_batch_dim(v),
                  {.layout = Layout::parse("dp,ring*sp", ""), .reduction_depth = depth(),
                   .atol = growth_ * (std::abs(1.0 - z_.guidance) + std::abs(z_.guidance)) * branch_atol,
                   .tolerance_factor = growth_});
    x = ref::euler_step<float>(x, v, sigma, sigma_next, round_);
    tap_latents(step + "latents_out", x, depth());

    x_ref = reference_step(step, x_ref, ref_sigmas_[t], ref_sigmas_[t + 1], t + 1 == z_.steps);
  }
  growth_ = free_ ? std::sqrt(double(z_.steps) + 1.0) : 1.0;
  tap_latents("final/latents", x, depth());
  // The final image, which image gates judge (PSNR/SSIM in the reports).
  ctx_.taps.tap("final/image", ref::with_batch_dim(ref::latents_to_rgb(x)),
                {.layout = Layout::parse("dp,ring*sp", ""), .reduction_depth = depth(), .tolerance_factor = growth_,
                 .image = fmt::format("patches:{},{}", z_.block.img_h, z_.block.img_w)});
  reference_final(x_ref);
  if (decode_) decode_final(x, x_ref);
}

// The schedule: built on rank 0, broadcast (as FLUX pipelines do with their
// timesteps), float32 values as the scheduler holds them.
std::vector<float> PipelineRun::schedule() {
  const auto s = ref::flow_match_schedule(z_.steps, int(place_.img));
  RefTensor want({s.sigmas.size()});
  for (std::size_t i = 0; i < want.size(); ++i) want.data[i] = static_cast<float>(s.sigmas[i]);
  ref_sigmas_ = want.data;
  Tensor sigmas({want.size()});
  if (ctx_.world.rank() == 0) sigmas = ref::cast<float>(want);
  if (ctx_.injected("timestep_temp_broadcast")) {
    Tensor tmp = sigmas;  // the loop keeps reading the original
    ctx_.world.broadcast(std::span<float>(tmp.data), 0);
  } else {
    ctx_.world.broadcast(std::span<float>(sigmas.data), 0);
  }
  ctx_.taps.tap("schedule/sigmas", sigmas, {.atol = 0.0, .rtol = 0.0});
  if (ctx_.taps.is_reference_rank() && !ctx_.taps.references_cached()) ctx_.taps.reference("schedule/sigmas", want);
  return sigmas.data;
}


// Inputs: generated from (seed, name, global index), so any rank makes its rows.
Tensor PipelineRun::noise() const {
  const Place& p = place_;
  const std::uint64_t seed = ctx_.injected("per_rank_noise") ? ctx_.seed + std::uint64_t(ctx_.world.rank()) : ctx_.seed;
  Tensor t = ref::generate(seed, "noise", {p.dp, p.img, z_.channels}, 1.0f, {{p.b, p.b + 1}, {p.first, p.first + p.rows}, {0, z_.channels}});
  round_to(ctx_.dtype, t.data);
  return ref::reshape(t, {p.rows, z_.channels});
}

// The prompt embedding [T, d] and pooled embedding [d] of a branch: sample
// b's prompt, or the one empty prompt every sample shares.
Tensor PipelineRun::prompt(const char* cond, const char* uncond, std::size_t branch, Shape s) const {
  Tensor t;
  if (branch == 0) {
    Shape g = s;
    g.insert(g.begin(), place_.dp);
    ref::Ranges r{{place_.b, place_.b + 1}};
    for (auto n : s) r.emplace_back(0, n);
    t = ref::reshape(ref::generate(ctx_.seed, cond, g, 1.0f, r), s);
  } else {
    t = ref::generate(ctx_.seed, uncond, s, 1.0f);
  }
  round_to(ctx_.dtype, t.data);
  return t;
}


// The RMS over every rank's tensors (each element held once).
double PipelineRun::rms(const std::vector<Tensor>& xs) const {
  std::vector<double> sums{0.0, 0.0};
  for (const auto& x : xs) {
    for (float e : x.data) sums[0] += double(e) * e;
    sums[1] += double(x.size());
  }
  ctx_.world.all_reduce_sum(std::span<double>(sums));
  return std::sqrt(sums[0] / sums[1]);
}


// The guided velocity: with cfg = 2 the pair exchanges its branches.
Tensor PipelineRun::guided(std::vector<Tensor>& v) {
  if (place_.cfg == 1) return ref::cfg_combine<float>(v[0], v[1], z_.guidance, round_);
  if (ctx_.injected("cfg_branch_dropped")) return v[0];
  Tensor other(v[0].shape);
  if (sendrecv_) {
    const int peer = 1 - int(place_.c);
    if (place_.c == 0) {
      cfg_comm_.send(std::span<const float>(v[0].data), peer);
      cfg_comm_.recv(std::span<float>(other.data), peer);
    } else {
      cfg_comm_.recv(std::span<float>(other.data), peer);
      cfg_comm_.send(std::span<const float>(v[0].data), peer);
    }
  } else {
    const auto both = cfg_comm_.all_gather(std::span<const float>(v[0].data));
    other.data.assign(both.begin() + (1 - place_.c) * other.size(), both.begin() + (2 - place_.c) * other.size());
  }
  return place_.c == 0 ? ref::cfg_combine<float>(v[0], other, z_.guidance, round_)
                       : ref::cfg_combine<float>(other, v[0], z_.guidance, round_);
}


// Taps. Image rows [dp, I, ...] split over ring x sp; per-branch tensors
// [dp, 2, ...] split over cfg too; text rows replicated over ring x sp.
void PipelineRun::tap_latents(const std::string& name, const Tensor& x, long depth) {
  ctx_.taps.tap(name, ref::with_batch_dim(x),
                {.layout = Layout::parse("dp,ring*sp", ""), .reduction_depth = depth, .tolerance_factor = growth_});
}
void PipelineRun::tap_branches(const std::string& name, const std::vector<Tensor>& per_branch, long depth, bool image_rows) {
  const Tensor all = ref::with_batch_dim(ref::stack(per_branch));
  ctx_.taps.tap(name, all,
                {.layout = Layout::parse(image_rows ? "dp,cfg,ring*sp" : "dp,cfg", ""), .reduction_depth = depth,
                 .tolerance_factor = growth_});
}


}  // namespace dc::flux_pipeline
