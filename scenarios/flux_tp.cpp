// flux_tp: a FLUX.1 single-stream block under Megatron tensor parallelism.
//
// Column-parallel q/k/v and proj_mlp (heads split over tp), per-head attention
// on each rank, then the row-parallel proj_out whose input is the PACKED
// concatenation [attn_i | mlp_i]: rank i needs the non-contiguous weight
// columns [i*d/W, (i+1)*d/W) and [d + i*M/W, d + (i+1)*M/W), an all-reduce over
// tp, the bias once, gate and residual. Each dp group runs its own sample.
//
// Faults (seeds/002 TP-1, vLLM/sglang RowParallelLinear):
//   proj_out_contiguous       rank i takes columns [i(d+M)/W, (i+1)(d+M)/W)
//   proj_out_bias_every_rank  every rank adds the bias before the all-reduce
#include <fmt/format.h>

#include <cmath>
#include <functional>

#include "harness/core/error.h"
#include "harness/run/scenario.h"
#include "reference/flux_block.h"
#include "reference/generate.h"
#include "reference/nn.h"

namespace dc {
namespace {

using ref::FluxSizes;

class FluxTp final : public Scenario {
 public:
  std::string name() const override { return "flux_tp"; }
  std::string summary() const override {
    return "FLUX.1 single-stream block, Megatron TP over 'tp' (column-parallel q/k/v/mlp, packed "
           "row-parallel proj_out + all-reduce), one sample per 'dp' group";
  }
  std::vector<std::string> sizes() const override { return {"default", "flux1-dev"}; }
  std::vector<FlagSpec> flags() const override {
    return {{"async_allreduce", FlagType::boolean, "false",
             "post the proj_out all-reduce non-blocking and wait just before the gate"}};
  }
  std::vector<FaultSpec> faults() const override {
    const auto sharded = [](const Mesh& m) { return m.axis_size("tp") > 1; };
    return {{"proj_out_contiguous",
             "row-parallel proj_out takes contiguous weight columns (seeds/002 TP-1): noise",
             "proj_out/weight", {}, "tp > 1", sharded},
            {"proj_out_bias_every_rank", "every tp rank adds the proj_out bias: y gets W x bias", "proj_out/partial",
             {}, "tp > 1", sharded}};
  }
  std::string default_mesh(int world) const override {
    auto [dp, tp] = default_two_axis_split(world);
    return fmt::format("dp={},tp={}", dp, tp);
  }
  void check_mesh(const Mesh& mesh, const std::string& size) const override {
    if (mesh.axes().size() != 2 || mesh.axis_index("dp") < 0 || mesh.axis_index("tp") < 0)
      input_error("flux_tp needs a mesh with exactly the axes dp and tp, got {}", mesh.str());
    const auto z = FluxSizes::preset(size);
    const int tp = mesh.axis_size("tp");
    if (z.heads % tp != 0)
      input_error("flux_tp ({}): tp={} must divide the {} heads", size, tp, z.heads);
  }

  void run(RunContext& ctx) const override {
    const auto z = FluxSizes::preset(ctx.size);
    const std::size_t tp = ctx.mesh.axis_size("tp"), dp = ctx.mesh.axis_size("dp");
    const auto coords = ctx.mesh.coords(ctx.world.rank());
    const std::size_t b = coords[ctx.mesh.axis_index("dp")], i = coords[ctx.mesh.axis_index("tp")];
    const Comm tp_comm = ctx.world.split(ctx.mesh, {"tp"});
    const auto rope = ref::flux_rope(z);
    const std::size_t n = z.tokens(), d = z.dim;

    // This dp group's sample.
    auto input = [&](const char* name, Shape s) {
      s.insert(s.begin(), dp);
      ref::Ranges r{{b, b + 1}};
      for (std::size_t k = 1; k < s.size(); ++k) r.emplace_back(0, s[k]);
      Tensor t = ref::generate(ctx.seed, name, s, 1.0f, r);
      round_to(ctx.dtype, t.data);
      t.shape.erase(t.shape.begin());
      return t;
    };
    const Tensor h = input("hidden", {n, d}), temb = input("temb", {1, d});
    const bool contiguous = ctx.injected("proj_out_contiguous");
    const bool bias_every_rank = ctx.injected("proj_out_bias_every_rank");
    const auto w = ref::make_flux_weights<float>(ctx.seed, z, tp, i, contiguous, ctx.dtype);
    std::function<void(Tensor&)> round = [&](Tensor& t) { round_to(ctx.dtype, t.data); };
    // The bias once: on tp rank 0, before the all-reduce (vLLM's RowParallelLinear rule).
    auto a = ref::flux_block_forward(h, temb, w, z, rope, bias_every_rank || i == 0, round);

    Tensor y = a.partial;
    Request pending;
    if (ctx.flags.get_bool("async_allreduce")) {
      pending = tp_comm.iall_reduce_sum(std::span<float>(y.data));
    } else {
      tp_comm.all_reduce_sum(std::span<float>(y.data));
    }
    record(ctx, z, a, h, temb, w.out_w);
    pending.wait();
    round(y);
    Tensor out = ref::gated_residual(y, a.ada, h);
    round(out);
    const Layout by_sample = Layout::parse("dp", "");
    ctx.taps.tap("y", ref::with_batch_dim(y), {.layout = by_sample, .reduction_depth = long(d + z.mlp)});
    ctx.taps.tap("out", ref::with_batch_dim(out), {.layout = by_sample, .reduction_depth = long(d + z.mlp)});

    record_reference(ctx, z, tp, dp, rope);
  }

 private:
  template <class T>
  static void record(RunContext& ctx, const FluxSizes& z, const ref::FluxActivations<T>& a, const BasicTensor<T>& h,
                     const BasicTensor<T>& temb, const BasicTensor<T>& out_w) {
    const long d = long(z.dim), m = long(z.mlp), n = long(z.tokens());
    const Layout sample = Layout::parse("dp", ""), heads = Layout::parse("dp,-,tp,-", ""),
                 cols = Layout::parse("dp,-,tp", "");
    ctx.taps.tap("input/hidden", ref::with_batch_dim(h), {.layout = sample});
    ctx.taps.tap("input/temb", ref::with_batch_dim(temb), {.layout = sample});
    ctx.taps.tap("adaln", ref::with_batch_dim(a.ada), {.layout = sample, .reduction_depth = d});
    ctx.taps.tap("nx", ref::with_batch_dim(a.nx), {.layout = sample, .reduction_depth = d});
    ctx.taps.tap("attn/q", ref::with_batch_dim(a.q), {.layout = heads, .reduction_depth = d});
    ctx.taps.tap("attn/k", ref::with_batch_dim(a.k), {.layout = heads, .reduction_depth = d});
    ctx.taps.tap("attn/v", ref::with_batch_dim(a.v), {.layout = heads, .reduction_depth = d});
    ctx.taps.tap("attn/out", ref::with_batch_dim(a.attn), {.layout = cols, .reduction_depth = n});
    ctx.taps.tap("mlp", ref::with_batch_dim(a.mlp), {.layout = cols, .reduction_depth = d});
    ctx.taps.tap("proj_out/input_packed", ref::with_batch_dim(a.cat), {.layout = cols, .reduction_depth = d});
    // The weight block must be exactly the reference's packed columns.
    ctx.taps.tap("proj_out/weight", out_w, {.layout = Layout::parse("-,tp", ""), .atol = 0.0, .rtol = 0.0});
    ctx.taps.tap("proj_out/partial", ref::with_batch_dim(a.partial),
                 {.layout = Layout::parse("dp", "tp"), .reduction_depth = d + m});
  }

  // The single-rank reference in float64, every sample with the full
  // weights; the samples are spread over the ranks (TapRecorder's rule).
  void record_reference(RunContext& ctx, const FluxSizes& z, std::size_t tp, std::size_t dp,
                        const ref::RopeTable& rope) const {
    const ReferenceClock clock(ctx.taps);
    const std::size_t n = z.tokens(), d = z.dim;
    const auto packed = ref::packed_columns(z, tp);
    if (ctx.taps.is_reference_rank()) {
      // What the sharded run should hold: the dtype-rounded weight, packed.
      auto w_run = ref::make_flux_weights<float>(ctx.seed, z, 1, 0, false, ctx.dtype);
      ctx.taps.reference("proj_out/weight", ref::to_ref(ref::take_last(w_run.out_w, packed)));
    }
    const auto samples = ctx.taps.my_reference_rows(dp);
    if (samples.empty()) return;
    const auto w = ref::make_flux_weights<double>(ctx.seed, z, 1, 0, false, ctx.dtype);
    const std::function<void(RefTensor&)> exact = [](RefTensor&) {};
    for (std::size_t b : samples) {
      auto input = [&](const char* name, std::size_t rows) {
        return ref::reshape(ref::to_ref(ref::generate(ctx.seed, name, {dp, rows, d}, 1.0f, {{b, b + 1}, {0, rows}, {0, d}})),
                            {rows, d});
      };
      const RefTensor h = input("hidden", n), temb = input("temb", 1);
      auto a = ref::flux_block_forward(h, temb, w, z, rope, true, exact);
      auto put = [&](const char* name, const RefTensor& t) { ctx.taps.reference_row(name, dp, b, t); };
      put("input/hidden", h);
      put("input/temb", temb);
      put("adaln", a.ada);
      put("nx", a.nx);
      put("attn/q", a.q);
      put("attn/k", a.k);
      put("attn/v", a.v);
      put("attn/out", a.attn);
      put("mlp", a.mlp);
      put("proj_out/input_packed", ref::take_last(a.cat, packed));
      put("proj_out/partial", a.partial);
      put("y", a.partial);
      put("out", ref::gated_residual(a.partial, a.ada, h));
    }
  }
};

}  // namespace

DIFFCHECK_REGISTER_SCENARIO(FluxTp)

}  // namespace dc
