// flux_pipeline: a small FLUX-style DiT run as a whole denoising pipeline —
// initial noise, the flow-match schedule, every step's velocity for the
// conditional and unconditional prompt, classifier-free guidance and the
// Euler step — sharded as real multi-GPU diffusion pipelines shard it:
//   dp    prompts of the batch;
//   cfg   1 or 2: with 2, the two CFG branches run on different ranks and
//         their velocities are exchanged within the pair;
//   ring, sp   unified sequence parallelism over the image tokens (rank
//         (r, s) holds image block r*sp + s), text tokens replicated and
//         joined to attention once (scenarios/joint_attention.h).
// Every step is checked against the float64 reference. Forced mode (the
// default) starts each step of the sharded run from the reference latents of
// that step, after tapping its own, so each step is judged on its own.
//
// Faults, from the pipeline bugs of real multi-GPU diffusion code:
//   per_rank_noise           each rank draws its initial noise from its own
//                            generator (HunyuanVideo-I2V#35, vllm-omni#2252)
//   cfg_branch_dropped       cfg=2: each rank takes its own branch as the guided
//                            velocity, the exchange skipped (vllm-omni#1578, sglang#18795)
//   text_kv_rotated          replicated text K/V travel the ring with the image
//                            blocks: text attended `ring` times (sglang#33327)
//   timestep_temp_broadcast  the schedule is broadcast into a temporary: ranks
//                            other than 0 denoise with sigma = 0 (seeds/002 TP-2)
#include <fmt/format.h>

#include <cmath>
#include <optional>

#include "harness/check/tolerance.h"
#include "harness/core/error.h"
#include "harness/run/scenario.h"
#include "reference/flux_pipeline.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "reference/ops.h"
#include "reference/timestep.h"
#include "scenarios/joint_attention.h"

namespace dc {
namespace {

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

class FluxPipeline final : public Scenario {
 public:
  std::string name() const override { return "flux_pipeline"; }
  std::string summary() const override {
    return "FLUX-style DiT denoising loop (Euler steps: 28, 6 at size tiny; classifier-free guidance): prompts over 'dp', CFG "
           "branches over 'cfg', image tokens over 'ring' x 'sp' (USP, text replicated); every step checked";
  }
  std::vector<std::string> sizes() const override { return {"default", "tiny"}; }
  bool is_pipeline() const override { return true; }
  std::vector<std::string> mesh_axes() const override { return {"dp", "cfg", "ring", "sp"}; }
  std::vector<FlagSpec> flags() const override {
    return {{"cfg_combine", FlagType::string, "allgather",
             "how the CFG pair exchanges its velocities: allgather or sendrecv", {"allgather", "sendrecv"}},
            {"ring_overlap", FlagType::boolean, "false",
             "post the next K/V transfer before computing the current block (double buffers)"},
            // usp_attention's matrix crosses these; here the nightly tries
            // only the CFG exchange and the ring overlap (the loop multiplies every cell by its steps).
            {"kv_transfer", FlagType::string, "p2p", "how K/V blocks travel: p2p (ring steps) or allgather", {"p2p"}},
            {"ulysses_chunks", FlagType::integer, "1", "split the all-to-alls into head chunks", {"1"}},
            {"async_a2a", FlagType::boolean, "false", "non-blocking Ulysses all-to-alls, waited before use", {"false"}},
            {"merge", FlagType::string, "sigmoid", "LSE merge form: sigmoid or maxexp", {"sigmoid"}}};
  }
  std::vector<FaultSpec> faults() const override {
    return {{"per_rank_noise",
             "each rank draws its initial noise from a generator seeded with its rank: the latents differ from "
             "the reference (but on rank 0) and across the CFG pair (HunyuanVideo-I2V#35, vllm-omni#2252)",
             "step00/latents", {}, "more than one rank", [](const Mesh& m) { return m.world_size() > 1; }},
            {"cfg_branch_dropped",
             "with the branches on different ranks, each takes its own branch's velocity as the guided one "
             "(the exchange skipped): the CFG pair diverges (vllm-omni#1578, sglang#18795)",
             "step00/v", {}, "cfg = 2", [](const Mesh& m) { return m.axis_size("cfg") == 2; }},
            {"text_kv_rotated",
             "the replicated text keys/values are packed into the image block that travels the ring: text is "
             "attended ring times (sglang#33327)",
             "step00/block0/attn", {}, "ring > 1", [](const Mesh& m) { return m.axis_size("ring") > 1; }},
            {"timestep_temp_broadcast",
             "the sigma schedule is broadcast into a temporary: ranks other than 0 keep zeros (seeds/002 TP-2)",
             "schedule/sigmas", {}, "more than one rank", [](const Mesh& m) { return m.world_size() > 1; }}};
  }
  std::string default_mesh(int world) const override {
    int cfg = 1, ring = 1, sp = 1, rest = world;
    for (int* axis : {&cfg, &sp, &ring})
      if (rest % 2 == 0) *axis *= 2, rest /= 2;
    return fmt::format("dp={},cfg={},ring={},sp={}", rest, cfg, ring, sp);
  }
  void check_mesh(const Mesh& mesh, const std::string& size) const override {
    const auto axes = mesh_axes();
    if (mesh.axes().size() != axes.size())
      input_error("flux_pipeline needs a mesh with exactly the axes dp, cfg, ring, sp (in that order), got {}", mesh.str());
    for (std::size_t i = 0; i < axes.size(); ++i)
      if (mesh.axis_index(axes[i]) != int(i))
        input_error("flux_pipeline needs a mesh with exactly the axes dp, cfg, ring, sp (in that order), got {}",
                    mesh.str());
    const PipelineSizes z = PipelineSizes::preset(size);
    const auto cfg = std::size_t(mesh.axis_size("cfg")), ring = std::size_t(mesh.axis_size("ring")),
               sp = std::size_t(mesh.axis_size("sp"));
    if (cfg > 2) input_error("flux_pipeline: cfg must be 1 or 2 (two branches), got {}", cfg);
    if (z.block.heads % sp) input_error("flux_pipeline ({}): sp={} must divide the {} heads", size, sp, z.block.heads);
    const std::size_t img = z.block.img_h * z.block.img_w;
    if (img % (ring * sp))
      input_error("flux_pipeline ({}): ring x sp = {} must divide the {} image tokens", size, ring * sp, img);
  }

  void run(RunContext& ctx) const override;
};

// One run: the sharded loop and, step by step beside it, the reference.
class Run {
 public:
  Run(RunContext& ctx)
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
    opt_.ring.overlap = ctx.flags.get_bool("ring_overlap");
    opt_.ring.allgather = transfer == "allgather";
    opt_.ring.sigmoid_merge = merge == "sigmoid";
    opt_.ring.dtype = ctx.dtype;
    opt_.fault_text_kv_rotated = ctx.injected("text_kv_rotated");
  }

  void go() {
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
      std::vector<Tensor> v_branch;
      std::vector<Tensor> temb, attn, out, out_txt;  // per branch, then per block
      for (std::size_t br : mine) {
        const Tensor pooled = prompt_pooled(br), txt = prompt_text(br);
        Tensor tb = ref::pipeline_temb<float>(static_cast<float>(1000.0f * float(sigma)), pooled, w_, z_, round_);
        temb.push_back(tb);
        const ref::AttendFn<float> attend = [&](std::size_t, const Tensor& q, const Tensor& k, const Tensor& v) {
          return joint_usp_attention(sp_comm_, ring_comm_, z_.block.txt, q, k, v, opt_);
        };
        const ref::BlockObserver<float> observe = [&](std::size_t, const ref::FluxActivations<float>& a, const Tensor& h) {
          attn.push_back(ref::take_rows(a.attn, z_.block.txt, a.attn.shape[0]));
          out.push_back(ref::take_rows(h, z_.block.txt, h.shape[0]));
          out_txt.push_back(ref::take_rows(h, 0, z_.block.txt));
        };
        v_branch.push_back(ref::flux_velocity<float>(x, txt, tb, w_, z_, rope_, attend, round_, observe));
      }
      tap_branches(step + "temb", temb, 1, false);
      for (std::size_t k = 0; k < z_.blocks; ++k) {
        tap_branches(step + fmt::format("block{}/attn", k), pick(attn, k), z_.block.tokens(), true);
        tap_branches(step + fmt::format("block{}/out", k), pick(out, k), depth(), true);
        tap_branches(step + fmt::format("block{}/out_txt", k), pick(out_txt, k), depth(), false);
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

      x_ref = reference_step(step, t, x_ref, ref_sigmas_[t], ref_sigmas_[t + 1]);
    }
    growth_ = free_ ? std::sqrt(double(z_.steps) + 1.0) : 1.0;
    tap_latents("final/latents", x, depth());
    reference_final(x_ref);
  }

 private:
  static PipelineSizes sizes(const RunContext& ctx) {
    PipelineSizes z = PipelineSizes::preset(ctx.size);
    if (ctx.pipeline.steps > 0) z.steps = ctx.pipeline.steps;
    return z;
  }
  static Place place(const RunContext& ctx, const PipelineSizes& z) {
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
  static ref::RopeTable rope_rows(const PipelineSizes& z, const Place& p) {
    std::vector<std::size_t> tokens;
    for (std::size_t i = 0; i < z.block.txt; ++i) tokens.push_back(i);
    for (std::size_t i = 0; i < p.rows; ++i) tokens.push_back(z.block.txt + p.first + i);
    return ref::flux_rope_rows(z.block, tokens);
  }
  long depth() const { return long(z_.block.dim + z_.block.mlp); }

  // The schedule: built on rank 0, broadcast (as FLUX pipelines do with their
  // timesteps), float32 values as the scheduler holds them.
  std::vector<float> schedule() {
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
    if (ctx_.taps.is_reference_rank()) ctx_.taps.reference("schedule/sigmas", want);
    return sigmas.data;
  }

  // Inputs: generated from (seed, name, global index), so any rank makes its rows.
  Tensor noise() const {
    const Place& p = place_;
    const std::uint64_t seed = ctx_.injected("per_rank_noise") ? ctx_.seed + std::uint64_t(ctx_.world.rank()) : ctx_.seed;
    Tensor t = ref::generate(seed, "noise", {p.dp, p.img, z_.channels}, 1.0f, {{p.b, p.b + 1}, {p.first, p.first + p.rows}, {0, z_.channels}});
    round_to(ctx_.dtype, t.data);
    return ref::reshape(t, {p.rows, z_.channels});
  }
  RefTensor reference_noise() const {
    const Place& p = place_;
    Tensor t = ref::generate(ctx_.seed, "noise", {p.dp, p.img, z_.channels}, 1.0f, {{p.b, p.b + 1}, {p.first, p.first + p.rows}, {0, z_.channels}});
    round_to(ctx_.dtype, t.data);  // the input as the run's dtype holds it
    return ref::to_ref(ref::reshape(t, {p.rows, z_.channels}));
  }
  // The prompt embedding [T, d] and pooled embedding [d] of a branch: sample
  // b's prompt, or the one empty prompt every sample shares.
  Tensor prompt_text(std::size_t branch) const { return prompt("prompt", "empty_prompt", branch, {z_.block.txt, z_.block.dim}); }
  Tensor prompt_pooled(std::size_t branch) const { return prompt("pooled", "empty_pooled", branch, {z_.block.dim}); }
  Tensor prompt(const char* cond, const char* uncond, std::size_t branch, Shape s) const {
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
  double rms(const std::vector<Tensor>& xs) const {
    std::vector<double> sums{0.0, 0.0};
    for (const auto& x : xs) {
      for (float e : x.data) sums[0] += double(e) * e;
      sums[1] += double(x.size());
    }
    ctx_.world.all_reduce_sum(std::span<double>(sums));
    return std::sqrt(sums[0] / sums[1]);
  }

  // The guided velocity: with cfg = 2 the pair exchanges its branches.
  Tensor guided(std::vector<Tensor>& v) {
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

  // Block k's entry of each branch: `xs` holds, branch after branch, one entry per block.
  template <class T>
  std::vector<BasicTensor<T>> pick(const std::vector<BasicTensor<T>>& xs, std::size_t k) const {
    std::vector<BasicTensor<T>> out;
    for (std::size_t i = k; i < xs.size(); i += z_.blocks) out.push_back(xs[i]);
    return out;
  }

  // Taps. Image rows [dp, I, ...] split over ring x sp; per-branch tensors
  // [dp, 2, ...] split over cfg too; text rows replicated over ring x sp.
  void tap_latents(const std::string& name, const Tensor& x, long depth = 0) {
    ctx_.taps.tap(name, ref::with_batch_dim(x),
                  {.layout = Layout::parse("dp,ring*sp", ""), .reduction_depth = depth, .tolerance_factor = growth_});
  }
  void tap_branches(const std::string& name, const std::vector<Tensor>& per_branch, long depth, bool image_rows) {
    const Tensor all = ref::with_batch_dim(ref::stack(per_branch));
    ctx_.taps.tap(name, all,
                  {.layout = Layout::parse(image_rows ? "dp,cfg,ring*sp" : "dp,cfg", ""), .reduction_depth = depth,
                   .tolerance_factor = growth_});
  }

  // The reference of step t in float64 for this rank's sample, branches and
  // image rows (the same rows the sharded run holds): the text rows on every
  // rank of ring x sp alike, attention over all tokens by an all-gather of
  // the image keys and values over ring x sp. Returns the next latents.
  RefTensor reference_step(const std::string& step, int t, const RefTensor& x, double sigma, double sigma_next);
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

RefTensor Run::reference_step(const std::string& step, int t, const RefTensor& x, double sigma, double sigma_next) {
  const ReferenceClock clock(ctx_.taps);
  if (!w_ref_) w_ref_ = ref::make_pipeline_weights<double>(ctx_.seed, z_, ctx_.dtype);
  (void)t;
  const Place& p = place_;
  const ref::Round<double> exact = [](RefTensor&) {};
  const std::function<RefTensor(const RefTensor&)> gather = [&](const RefTensor& mine) {
    Shape s = mine.shape;
    s[0] *= std::size_t(seq_comm_.size());
    return RefTensor(s, seq_comm_.all_gather(std::span<const double>(mine.data)));
  };
  std::vector<RefTensor> v_branch, temb, attn, out, out_txt;
  for (std::size_t br : p.branches()) {
    const RefTensor pooled = ref::to_ref(prompt_pooled(br)), txt = ref::to_ref(prompt_text(br));
    // The model receives 1000 sigma as a float32 tensor (see timestep_broadcast).
    const RefTensor tb = ref::pipeline_temb<double>(static_cast<float>(1000.0f * float(sigma)), pooled, *w_ref_, z_, exact);
    temb.push_back(tb);
    const ref::AttendFn<double> attend = [&](std::size_t, const RefTensor& q, const RefTensor& k, const RefTensor& v) {
      return joint_reference_attention(z_.block.txt, q, k, v, gather);
    };
    const ref::BlockObserver<double> observe = [&](std::size_t, const ref::FluxActivations<double>& a, const RefTensor& h) {
      attn.push_back(ref::take_rows(a.attn, z_.block.txt, a.attn.shape[0]));
      out.push_back(ref::take_rows(h, z_.block.txt, h.shape[0]));
      out_txt.push_back(ref::take_rows(h, 0, z_.block.txt));
    };
    v_branch.push_back(ref::flux_velocity<double>(x, txt, tb, *w_ref_, z_, rope_, attend, exact, observe));
  }
  put_latents(step + "latents", x);
  put_branches(step + "temb", temb, false);
  for (std::size_t k = 0; k < z_.blocks; ++k) {
    put_branches(step + fmt::format("block{}/attn", k), pick(attn, k), true);
    put_branches(step + fmt::format("block{}/out", k), pick(out, k), true);
    put_branches(step + fmt::format("block{}/out_txt", k), pick(out_txt, k), false);
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
  return next;
}

void Run::reference_final(const RefTensor& x) {
  put_latents("final/latents", x);
}

// The reference boxes: image rows by the rank that holds them (once per CFG
// pair), text rows by rank (0, 0) of ring x sp, each branch by its rank.
void Run::put_latents(const std::string& name, const RefTensor& x) {
  const Place& p = place_;
  if (p.c != 0) return;
  ctx_.taps.reference_block(name, {p.dp, p.img, x.shape[1]}, {p.b, p.first, 0}, ref::with_batch_dim(x));
}

void Run::put_branches(const std::string& name, const std::vector<RefTensor>& per_branch, bool image_rows) {
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

void FluxPipeline::run(RunContext& ctx) const { Run(ctx).go(); }

}  // namespace

DIFFCHECK_REGISTER_SCENARIO(FluxPipeline)

}  // namespace dc
