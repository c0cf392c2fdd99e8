// unreduced_reshard: JAX/Shardy partial-sum semantics (seeds/001, xla #40034).
//
// x [B,S,H] sharded ((dp,fsdp), sp, -) and g [B,S,F] sharded ((dp,fsdp), sp, tp);
// the local einsum 'bsh,bsf->hf' leaves partial sums unreduced over
// {dp, fsdp, sp}. They are resharded to ((fsdp,sp), tp) with dp replicated.
// Like the SPMD partitioner of the report, the planner takes the "efficient"
// lowering (reduce-scatter over fsdp*sp, then all-reduce over dp) when dp == 2
// and falls back to reduce-everything-then-slice otherwise.
//
// Fault `skip_unreduced_allreduce`: the efficient path drops the dp all-reduce
// (XLA's AllReduceAlongShardingDimsInternal returning early for operands with
// unreduced axes). Hidden on meshes where the planner falls back.
#include <fmt/format.h>

#include <algorithm>

#include <spdlog/spdlog.h>

#include "harness/core/error.h"
#include "harness/core/reshard.h"
#include "harness/run/scenario.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "reference/ops.h"

namespace dc {
namespace {

struct ReshardSizes {
  std::size_t batch = 8, seq = 256, hidden = 256, ffn = 1024;
};

const Layout kX = Layout::parse("dp*fsdp,sp,-", "");
const Layout kG = Layout::parse("dp*fsdp,sp,tp", "");
const Layout kPartials = Layout::parse("-,tp", "dp*fsdp*sp");
const Layout kTarget = Layout::parse("fsdp*sp,tp", "");

class UnreducedReshard final : public Scenario {
 public:
  std::string name() const override { return "unreduced_reshard"; }
  std::string summary() const override {
    return "einsum 'bsh,bsf->hf' leaves partials unreduced over dp*fsdp*sp; reshard to "
           "((fsdp,sp), tp) with dp replicated; the planner's efficient path (dp == 2) vs fallback";
  }
  std::vector<std::string> mesh_axes() const override { return {"dp", "fsdp", "sp", "tp"}; }
  std::vector<FaultSpec> faults() const override {
    return {{"skip_unreduced_allreduce",
             "the efficient reshard path skips the dp all-reduce (xla #40034); only meshes with "
             "dp == 2 take that path",
             "result", {}, "dp == 2", [](const Mesh& m) { return m.axis_size("dp") == 2; }}};
  }
  std::string default_mesh(int world) const override {
    // Spread the ranks over the four axes, tp first, as evenly as powers of two allow.
    int size[4] = {1, 1, 1, 1};  // dp, fsdp, sp, tp
    int n = world, axis = 3;
    while (n % 2 == 0) {
      size[axis] *= 2;
      n /= 2;
      axis = (axis + 3) % 4;
    }
    size[0] *= n;
    return fmt::format("dp={},fsdp={},sp={},tp={}", size[0], size[1], size[2], size[3]);
  }
  void check_mesh(const Mesh& mesh, const std::string&) const override {
    for (const auto& a : mesh_axes())
      if (mesh.axis_index(a) < 0 || mesh.axes().size() != 4)
        input_error("unreduced_reshard needs the axes dp, fsdp, sp, tp; got {}", mesh.str());
    const ReshardSizes z;
    auto need = [&](std::size_t dim, std::size_t by, const char* what) {
      if (dim % by) input_error("unreduced_reshard: {} = {} does not split {} ways", what, dim, by);
    };
    const int dp = mesh.axis_size("dp"), fsdp = mesh.axis_size("fsdp"), sp = mesh.axis_size("sp"),
              tp = mesh.axis_size("tp");
    need(z.batch, dp * fsdp, "batch (dp*fsdp)");
    need(z.seq, sp, "sequence (sp)");
    need(z.ffn, tp, "ffn (tp)");
    need(z.hidden, fsdp * sp, "hidden (fsdp*sp)");
  }

  void run(RunContext& ctx) const override {
    const ReshardSizes z;
    const Mesh& mesh = ctx.mesh;
    const int rank = ctx.world.rank();
    const Shape xs{z.batch, z.seq, z.hidden}, gs{z.batch, z.seq, z.ffn};
    auto local = [&](const char* name, const Shape& global, const Layout& l) {
      ref::Ranges r;
      for (std::size_t d = 0; d < global.size(); ++d) {
        std::size_t n = 1;
        const auto axes = d < l.spec.size() ? l.spec[d] : std::vector<std::string>{};
        for (const auto& a : axes) n *= mesh.axis_size(a);
        std::size_t b = axes.empty() ? 0 : mesh.index_in(rank, axes), len = global[d] / n;
        r.emplace_back(b * len, (b + 1) * len);
      }
      Tensor t = ref::generate(ctx.seed, name, global, 1.0f, r);
      round_to(ctx.dtype, t.data);
      return t;
    };
    Tensor x = local("x", xs, kX), g = local("g", gs, kG);
    const std::size_t rows = x.shape[0] * x.shape[1];
    Tensor partials = ref::matmul_tn(ref::reshape(x, {rows, z.hidden}), ref::reshape(g, {rows, g.shape[2]}));
    round_to(ctx.dtype, partials.data);
    const long depth = long(z.batch * z.seq);
    ctx.taps.tap("partials", partials, {.layout = kPartials, .reduction_depth = depth});

    const bool efficient = mesh.axis_size("dp") == 2;
    ReshardPlan plan = efficient ? plan_reshard_reduce_scatter(kPartials, kTarget, 2)
                                 : plan_reshard_general(kPartials, kTarget, 2);
    if (efficient && ctx.injected("skip_unreduced_allreduce"))
      std::erase_if(plan, [](const ReshardStep& s) { return s.kind == ReshardStep::Kind::all_reduce; });
    spdlog::info("reshard plan ({}): {}", efficient ? "efficient" : "fallback", plan_str(plan));

    // Run the first step alone so its result can be tapped.
    Tensor mid = execute_reshard(ctx.world, mesh, partials, {plan.front()});
    round_to(ctx.dtype, mid.data);
    Layout mid_layout = plan.front().kind == ReshardStep::Kind::reduce_scatter
                            ? Layout::parse("fsdp*sp,tp", "dp")
                            : Layout::parse("-,tp", "");
    ctx.taps.tap(efficient ? "after_reduce_scatter" : "after_all_reduce", mid,
                 {.layout = mid_layout, .reduction_depth = depth});
    Tensor result = execute_reshard(ctx.world, mesh, mid, ReshardPlan(plan.begin() + 1, plan.end()));
    round_to(ctx.dtype, result.data);
    ctx.taps.tap("result", result, {.layout = kTarget, .reduction_depth = depth});

    if (ctx.taps.is_reference_rank() && !ctx.taps.references_cached()) {  // else read from the cache
      const ReferenceClock clock(ctx.taps);
      RefTensor xr = ref::to_ref(ref::generate(ctx.seed, "x", xs, 1.0f));
      RefTensor gr = ref::to_ref(ref::generate(ctx.seed, "g", gs, 1.0f));
      RefTensor full = ref::matmul_tn(ref::reshape(xr, {z.batch * z.seq, z.hidden}),
                                      ref::reshape(gr, {z.batch * z.seq, z.ffn}));
      ctx.taps.reference("partials", full);
      ctx.taps.reference(efficient ? "after_reduce_scatter" : "after_all_reduce", full);
      ctx.taps.reference("result", full);
    }
  }
};

}  // namespace

DIFFCHECK_REGISTER_SCENARIO(UnreducedReshard)

}  // namespace dc
