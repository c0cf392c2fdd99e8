// timestep_broadcast: the FLUX denoise schedule is computed on rank 0 and
// broadcast; every rank then embeds each timestep (sinusoid -> MLP -> temb ->
// adaLN shift/scale/gate). Every tap must be bitwise equal on all ranks.
//
// Fault `timestep_temp_broadcast` (seeds/002, TP-2): the broadcast lands in a
// temporary (PyTorch: dist.broadcast(t.cuda(), 0) on a CPU tensor), so every
// rank but 0 keeps t = 0 for the whole loop.
#include <fmt/format.h>

#include <cmath>

#include "harness/core/error.h"
#include "harness/run/scenario.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "reference/timestep.h"

namespace dc {
namespace {

struct Sizes {
  int steps = 28;
  int image_seq_len = 4096;  // 1024x1024 latents, as in the FLUX pipeline
  int freq_dim = 256;
  int dim = 256;
  int pooled_dim = 64;
  double guidance = 3.5;
};

// The weights of the timestep/guidance/text embedders and one adaLN Linear.
template <class T>
struct Weights {
  BasicTensor<T> t1w, t1b, t2w, t2b, g1w, g1b, g2w, g2b, p1w, p1b, p2w, p2b, aw, ab, pooled;
};

template <class T>
Weights<T> make_weights(std::uint64_t seed, const Sizes& z, DType dtype) {
  auto gen = [&](const std::string& name, Shape s, std::size_t fan_in) {
    return ref::as_run_values<T>(ref::generate(seed, name, s, 1.0f / std::sqrt(static_cast<float>(fan_in))), dtype);
  };
  const std::size_t d = z.dim, f = z.freq_dim, p = z.pooled_dim;
  return Weights<T>{gen("time.l1.w", {d, f}, f),  gen("time.l1.b", {d}, f),
                    gen("time.l2.w", {d, d}, d),  gen("time.l2.b", {d}, d),
                    gen("guid.l1.w", {d, f}, f),  gen("guid.l1.b", {d}, f),
                    gen("guid.l2.w", {d, d}, d),  gen("guid.l2.b", {d}, d),
                    gen("text.l1.w", {d, p}, p),  gen("text.l1.b", {d}, p),
                    gen("text.l2.w", {d, d}, d),  gen("text.l2.b", {d}, d),
                    gen("adaln.w", {3 * d, d}, d), gen("adaln.b", {3 * d}, d),
                    gen("pooled", {p}, 1)};
}

// One embedding step in element type T; `round` applies the run's dtype after
// every op (identity for the float64 reference).
template <class T, class Round>
struct Embedder {
  const Weights<T>& w;
  const Sizes& z;
  Round round;

  BasicTensor<T> r(BasicTensor<T> x) const {
    round(x);
    return x;
  }
  BasicTensor<T> mlp(const BasicTensor<T>& x, const BasicTensor<T>& w1, const BasicTensor<T>& b1,
                     const BasicTensor<T>& w2, const BasicTensor<T>& b2) const {
    return r(ref::linear(r(ref::silu(r(ref::linear(x, w1, b1)))), w2, b2));
  }
  BasicTensor<T> sinusoid(double t) const { return r(ref::timestep_sinusoid<T>(t, z.freq_dim)); }
  // guidance and pooled-text branches do not depend on the step.
  BasicTensor<T> constant_part() const {
    auto g = mlp(sinusoid(1000.0 * z.guidance), w.g1w, w.g1b, w.g2w, w.g2b);
    auto p = mlp(w.pooled, w.p1w, w.p1b, w.p2w, w.p2b);
    return r(ref::add(g, p));
  }
  BasicTensor<T> temb(const BasicTensor<T>& sin, const BasicTensor<T>& constant) const {
    return r(ref::add(mlp(sin, w.t1w, w.t1b, w.t2w, w.t2b), constant));
  }
  BasicTensor<T> adaln(const BasicTensor<T>& temb) const {
    auto y = r(ref::linear(r(ref::silu(temb)), w.aw, w.ab));
    y.shape = {3, static_cast<std::size_t>(z.dim)};  // (shift, scale, gate)
    return y;
  }
};

class TimestepBroadcast final : public Scenario {
 public:
  std::string name() const override { return "timestep_broadcast"; }
  std::string summary() const override {
    return "FLUX flow-match schedule built on rank 0 and broadcast; every rank embeds each "
           "timestep (sinusoid, MLP, temb, adaLN). All taps replicated.";
  }
  std::vector<FlagSpec> flags() const override {
    return {{"async_bcast", FlagType::boolean, "false",
             "broadcast with MPI_Ibcast and wait before the loop reads the schedule"}};
  }
  std::vector<FaultSpec> faults() const override {
    return {{"timestep_temp_broadcast",
             "broadcast into a temporary copy; ranks other than 0 keep t=0 (seeds/002 TP-2)",
             "schedule/timesteps", {}, "more than one rank", [](const Mesh& m) { return m.world_size() > 1; }}};
  }
  std::string default_mesh(int world) const override {
    auto [dp, tp] = default_two_axis_split(world);
    return fmt::format("dp={},tp={}", dp, tp);
  }
  void check_mesh(const Mesh&, const std::string&) const override {}  // any mesh: all replicated

  void run(RunContext& ctx) const override {
    const Sizes z;
    broadcast_schedule_and_embed(ctx, z);
    if (ctx.taps.is_reference_rank() && !ctx.taps.references_cached()) {  // else read from the cache
      const ReferenceClock clock(ctx.taps);
      record_reference(ctx, z);
    }
  }

 private:
  void broadcast_schedule_and_embed(RunContext& ctx, const Sizes& z) const {
    const auto n = static_cast<std::size_t>(z.steps);
    Tensor timesteps({n}), sigmas({n + 1});
    if (ctx.world.rank() == 0) {
      auto s = ref::flow_match_schedule(z.steps, z.image_seq_len);
      std::copy(s.timesteps.begin(), s.timesteps.end(), timesteps.data.begin());
      std::copy(s.sigmas.begin(), s.sigmas.end(), sigmas.data.begin());
    }
    if (ctx.injected("timestep_temp_broadcast")) {
      Tensor ts_tmp = timesteps, sg_tmp = sigmas;  // the loop below keeps reading the originals
      broadcast(ctx, ts_tmp, sg_tmp);
    } else {
      broadcast(ctx, timesteps, sigmas);
    }
    ctx.taps.tap("schedule/timesteps", timesteps);
    ctx.taps.tap("schedule/sigmas", sigmas);

    const auto w = make_weights<float>(ctx.seed, z, ctx.dtype);
    auto round = [&](Tensor& t) { round_to(ctx.dtype, t.data); };
    Embedder<float, decltype(round)> e{w, z, round};
    const Tensor constant = e.constant_part();
    for (int i = 0; i < z.steps; ++i) {
      auto sin = e.sinusoid(timesteps.data[i]);
      auto temb = e.temb(sin, constant);
      auto ada = e.adaln(temb);
      record_step(ctx, i, z, sin, temb, ada);
    }
  }

  static void broadcast(RunContext& ctx, Tensor& timesteps, Tensor& sigmas) {
    if (ctx.flags.get_bool("async_bcast")) {
      Request a = ctx.world.ibroadcast(std::span<float>(timesteps.data), 0);
      Request b = ctx.world.ibroadcast(std::span<float>(sigmas.data), 0);
      a.wait();
      b.wait();
    } else {
      ctx.world.broadcast(std::span<float>(timesteps.data), 0);
      ctx.world.broadcast(std::span<float>(sigmas.data), 0);
    }
  }

  template <class T>
  static void record_step(RunContext& ctx, int i, const Sizes& z, const BasicTensor<T>& sin,
                          const BasicTensor<T>& temb, const BasicTensor<T>& ada) {
    const std::string step = fmt::format("step{:02d}", i);
    // Depth: the contraction length of the Linear that produced the tap.
    if constexpr (std::is_same_v<T, float>) {
      ctx.taps.tap(step + "/sinusoid", sin, {.reduction_depth = 1});
      ctx.taps.tap(step + "/temb", temb, {.reduction_depth = z.dim});
      ctx.taps.tap(step + "/adaln", ada, {.reduction_depth = z.dim});
    } else {
      ctx.taps.reference(step + "/sinusoid", sin);
      ctx.taps.reference(step + "/temb", temb);
      ctx.taps.reference(step + "/adaln", ada);
    }
  }

  // The single-rank reference: the schedule and every embedding in float64.
  void record_reference(RunContext& ctx, const Sizes& z) const {
    auto s = ref::flow_match_schedule(z.steps, z.image_seq_len);
    ctx.taps.reference("schedule/timesteps", RefTensor({s.timesteps.size()}, s.timesteps));
    ctx.taps.reference("schedule/sigmas", RefTensor({s.sigmas.size()}, s.sigmas));
    const auto w = make_weights<double>(ctx.seed, z, ctx.dtype);
    auto exact = [](RefTensor&) {};
    Embedder<double, decltype(exact)> e{w, z, exact};
    const RefTensor constant = e.constant_part();
    for (int i = 0; i < z.steps; ++i) {
      // The model's input is the float32 timestep tensor, as in the pipeline;
      // the embedding of t~1000 is too ill-conditioned (d/dt = 1000 ulp per
      // ulp of t) to compare against an exact t.
      auto sin = e.sinusoid(static_cast<float>(s.timesteps[i]));
      auto temb = e.temb(sin, constant);
      record_step(ctx, i, z, sin, temb, e.adaln(temb));
    }
  }
};

}  // namespace

DIFFCHECK_REGISTER_SCENARIO(TimestepBroadcast)

}  // namespace dc
