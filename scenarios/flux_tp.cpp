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
             "proj_out/weight", {}, "tp > 1", sharded, {}, {}, false, {}, "proj_out/partial"},
            {"proj_out_bias_every_rank", "every tp rank adds the proj_out bias: y gets W x bias", "proj_out/partial",
             {}, "tp > 1", sharded, {}, {}, false, "the ranks other than tp rank 0 add A x bias: y gets (1 + A(W-1)) x bias"}};
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
    // The sharded block in a scope of its own: its weights and activations
    // are gone (copied into the taps) before the reference needs the memory.
    {
    const Tensor h = input("hidden", {n, d}), temb = input("temb", {1, d});
    const bool contiguous = ctx.injected("proj_out_contiguous");
    const bool bias_every_rank = ctx.injected("proj_out_bias_every_rank");
    auto w = ref::make_flux_weights<float>(ctx.seed, z, tp, i, contiguous, ctx.dtype);
    std::function<void(Tensor&)> round = [&](Tensor& t) { round_to(ctx.dtype, t.data); };
    if (bias_every_rank && i != 0 && ctx.fault_scale != 1.0) {
      // --fault-scale A: the extra ranks add A times the bias (y gets (1 + A(W-1)) x bias).
      for (auto& x : w.out_b.data) x = static_cast<float>(x * ctx.fault_scale);
      round(w.out_b);
    }
    // The bias once: on tp rank 0, before the all-reduce (vLLM's RowParallelLinear rule).
    auto a = ref::flux_block_forward(h, temb, w, z, rope, bias_every_rank || i == 0, round);

    Tensor y = a.partial;
    Request pending;
    if (ctx.flags.get_bool("async_allreduce")) {
      pending = tp_comm.iall_reduce_sum(std::span<float>(y.data));
    } else {
      tp_comm.all_reduce_sum(std::span<float>(y.data));
    }
    const Tensor ada = a.ada;  // the gate, after the activations have moved into the taps
    record(ctx, z, std::move(a), h, temb, std::move(w.out_w));
    pending.wait();
    round(y);
    Tensor out = ref::gated_residual(y, ada, h);
    round(out);
    const Layout by_sample = Layout::parse("dp", "");
    ctx.taps.tap("y", ref::with_batch_dim(std::move(y)), {.layout = by_sample, .reduction_depth = long(d + z.mlp)});
    ctx.taps.tap("out", ref::with_batch_dim(std::move(out)), {.layout = by_sample, .reduction_depth = long(d + z.mlp)});
    }
    ctx.taps.all_taps_recorded();  // their writing may begin beside the reference

    record_reference(ctx, z, tp_comm, b, i, dp, rope);
  }

 private:
  // The activations move into the taps (copies would be GBs of new pages at
  // flux1-dev size); h and temb are copied, the gate needs h after.
  template <class T>
  static void record(RunContext& ctx, const FluxSizes& z, ref::FluxActivations<T>&& a, const BasicTensor<T>& h,
                     const BasicTensor<T>& temb, BasicTensor<T>&& out_w) {
    const long d = long(z.dim), m = long(z.mlp), n = long(z.tokens());
    const Layout sample = Layout::parse("dp", ""), heads = Layout::parse("dp,-,tp,-", ""),
                 cols = Layout::parse("dp,-,tp", "");
    ctx.taps.tap("input/hidden", ref::with_batch_dim(h), {.layout = sample});
    ctx.taps.tap("input/temb", ref::with_batch_dim(temb), {.layout = sample});
    ctx.taps.tap("adaln", ref::with_batch_dim(std::move(a.ada)), {.layout = sample, .reduction_depth = d});
    ctx.taps.tap("nx", ref::with_batch_dim(std::move(a.nx)), {.layout = sample, .reduction_depth = d});
    ctx.taps.tap("attn/q", ref::with_batch_dim(std::move(a.q)), {.layout = heads, .reduction_depth = d});
    ctx.taps.tap("attn/k", ref::with_batch_dim(std::move(a.k)), {.layout = heads, .reduction_depth = d});
    ctx.taps.tap("attn/v", ref::with_batch_dim(std::move(a.v)), {.layout = heads, .reduction_depth = d});
    ctx.taps.tap("attn/out", ref::with_batch_dim(std::move(a.attn)), {.layout = cols, .reduction_depth = n});
    ctx.taps.tap("mlp", ref::with_batch_dim(std::move(a.mlp)), {.layout = cols, .reduction_depth = d});
    // proj_out's input and weight columns are packed per tp rank ([attn | mlp]
    // of each shard in turn): their order follows the mesh (per_mesh), so a
    // run on another tp size holds them otherwise (compare --against skips them there).
    ctx.taps.tap("proj_out/input_packed", ref::with_batch_dim(std::move(a.cat)),
                 {.layout = cols, .reduction_depth = d, .per_mesh = true});
    // The weight block must be exactly the reference's packed columns.
    ctx.taps.tap("proj_out/weight", std::move(out_w),
                 {.layout = Layout::parse("-,tp", ""), .atol = 0.0, .rtol = 0.0, .per_mesh = true});
    ctx.taps.tap("proj_out/partial", ref::with_batch_dim(std::move(a.partial)),
                 {.layout = Layout::parse("dp", "tp"), .reduction_depth = d + m});
  }

  // What the sharded run should hold of proj_out's weight: the
  // dtype-rounded weight, packed; its rows spread over the ranks.
  static void record_run_weight(RunContext& ctx, const FluxSizes& z, const ref::ColumnRanges& packed) {
    const std::size_t d = z.dim;
    const std::size_t world = static_cast<std::size_t>(ctx.world.size()), me = static_cast<std::size_t>(ctx.world.rank());
    const std::size_t r0 = me * d / world, r1 = (me + 1) * d / world;
    const Tensor w_run = ref::proj_out_weight(ctx.seed, z, {{r0, r1}, {0, d + z.mlp}});
    ctx.taps.reference_rows("proj_out/weight", {d, d + z.mlp}, r0,
                            ref::to_ref(ref::take_last(ref::as_run_values<float>(w_run, ctx.dtype), packed)));
  }

  // The group's ranks all need the same full weights: each generates 1/parts
  // of every weight's rows and they all-gather the rest (generation is a
  // seventh of the reference's time at flux1-dev size).
  static ref::GenerateBlock shared_generator(RunContext& ctx, const Comm& tp_comm, std::size_t parts, std::size_t i) {
    return [&ctx, &tp_comm, parts, i](const std::string& name, const Shape& global, float scale,
                                      const ref::Ranges& block) {
      ref::Ranges all = block;
      if (all.empty())
        for (auto x : global) all.emplace_back(0, x);
      const std::size_t count = all[0].second - all[0].first;
      if (parts == 1 || count % parts != 0) return ref::generate(ctx.seed, name, global, scale, block);
      ref::Ranges mine = all;
      mine[0] = {all[0].first + i * count / parts, all[0].first + (i + 1) * count / parts};
      const Tensor part = ref::generate(ctx.seed, name, global, scale, mine);
      Shape shape;
      for (auto [a, e] : all) shape.push_back(e - a);
      return Tensor(shape, tp_comm.all_gather(std::span<const float>(part.data)));
    };
  }

  // The reference's activations as taps. Tap shapes are [dp, tokens, ...]:
  // this part is sample b, tokens [t0, t0 + rows). Activations move into the
  // recorder (at flux1-dev size they are GBs).
  static void record_reference_taps(RunContext& ctx, ref::FluxActivations<double>&& a, RefTensor&& h,
                                    const RefTensor& temb, const ref::ColumnRanges& packed, std::size_t n,
                                    std::size_t dp, std::size_t b, std::size_t t0, bool first_part) {
    auto put = [&](const char* name, RefTensor&& t) {
      Shape global = t.shape;
      global[0] = n;
      global.insert(global.begin(), dp);
      t.shape.insert(t.shape.begin(), 1);
      std::vector<std::size_t> start(global.size(), 0);
      start[0] = b;
      start[1] = t0;
      ctx.taps.reference_block(name, global, std::move(start), std::move(t));
    };
    if (first_part) {
      ctx.taps.reference_row("input/temb", dp, b, temb);
      ctx.taps.reference_row("adaln", dp, b, a.ada);
    }
    put("out", ref::gated_residual(a.partial, a.ada, h));
    put("input/hidden", std::move(h));
    put("nx", std::move(a.nx));
    put("attn/q", std::move(a.q));
    put("attn/k", std::move(a.k));
    put("attn/v", std::move(a.v));
    put("attn/out", std::move(a.attn));
    put("mlp", std::move(a.mlp));
    put("proj_out/input_packed", ref::take_last(a.cat, packed));
    a.cat = {};
    put("y", RefTensor(a.partial));
    put("proj_out/partial", std::move(a.partial));
  }

  // The single-rank reference in float64, every sample with the full
  // weights. Sample b is computed by the tp group that runs it, each tp rank
  // taking N/tp of its query tokens (every op but attention is token-local;
  // attention all-gathers k and v over the group): so every rank shares the
  // reference work, also at dp = 1, and holds only its rows' activations.
  void record_reference(RunContext& ctx, const FluxSizes& z, const Comm& tp_comm, std::size_t b,
                        std::size_t i, std::size_t dp, const ref::RopeTable& rope) const {
    if (ctx.taps.references_cached()) return;  // read from the reference cache
    const ReferenceClock clock(ctx.taps);
    const std::size_t n = z.tokens(), d = z.dim, tp = static_cast<std::size_t>(tp_comm.size());
    const auto packed = ref::packed_columns(z, tp);
    record_run_weight(ctx, z, packed);
    // Tokens split evenly over the group, or (when tp does not divide them) the
    // whole sample on tp rank 0.
    const std::size_t parts = n % tp == 0 ? tp : 1;
    if (i >= parts) return;
    const std::size_t t0 = i * n / parts, rows = n / parts;
    const ref::GenerateBlock shared = shared_generator(ctx, tp_comm, parts, i);
    const std::function<void(RefTensor&)> exact = [](RefTensor&) {};
    const ref::GatherTokens<double> gather = [&](const RefTensor& mine) {
      Shape all = mine.shape;
      all[0] = n;
      return RefTensor(all, tp_comm.all_gather(std::span<const double>(mine.data)));
    };
    auto input = [&](const char* name, std::size_t first, std::size_t count, std::size_t total) {
      return ref::reshape(
          ref::to_ref(ref::generate(ctx.seed, name, {dp, total, d}, 1.0f, {{b, b + 1}, {first, first + count}, {0, d}})),
          {count, d});
    };
    RefTensor h = input("hidden", t0, rows, n), temb = input("temb", 0, 1, 1);
    // The weights live only while they are used: those before attention
    // until attention, proj_out's (made only then) a block of rows at a time
    // in its product. The gathered k and v, proj_out's blocks and the copies made while recording
    // below (the packed proj_out input, y, out) take their memory in turn,
    // not new pages (new memory is the dearest thing on a VM that hands freed
    // pages back to its host: docs/usage.md, "Memory").
    // The generated float32 values as they are (the reference's weights are
    // never rounded to the run's dtype), widened block by block inside each
    // product: at flux1-dev size the whole float64 copy would be 1.1 GB per rank.
    const ref::GenerateBlock all_but_out_w = [&](const std::string& name, const Shape& global, float scale,
                                                 const ref::Ranges& block) {
      return name == "proj_out.w" ? Tensor() : shared(name, global, scale, block);
    };
    const ref::OutWeightRows<float> out_w_rows = [&](std::size_t r0, std::size_t r1) {
      return ref::proj_out_weight(ctx.seed, z, {{r0, r1}, {0, d + z.mlp}}, shared);
    };
    auto a = ref::flux_block_forward_lean(h, temb,
                                          ref::make_flux_weights<float>(ctx.seed, z, 1, 0, false, DType::float32, all_but_out_w),
                                          out_w_rows, z, rope, true, exact, t0,
                                          parts > 1 ? gather : ref::GatherTokens<double>{});
    record_reference_taps(ctx, std::move(a), std::move(h), temb, packed, n, dp, b, t0, i == 0);
  }
};

}  // namespace

DIFFCHECK_REGISTER_SCENARIO(FluxTp)

}  // namespace dc
