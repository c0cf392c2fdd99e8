// mlp_pp: a pipeline-parallel stack of residual MLP blocks (issue 62; the
// stage split of torchtitan's and Megatron's pipelines, the GPipe schedule).
//
// Eight blocks h = x + fc2(gelu(fc1(x))) split into equal stages over the
// `pp` axis; each dp replica runs its own pipeline on its share of the batch,
// which it cuts into 4 microbatches. Stage s takes microbatch m from stage
// s - 1 (point to point), runs its blocks on it and hands it to stage s + 1.
// Each block's taps are its stage's (the `stage` attribute): the ranks of
// other stages record nothing under them but zeros, which are never read;
// every microbatch's rows are laid together in order (`microbatches`), so a
// tap is the stage's whole local batch, compared with the whole stack run on
// the whole batch in float64.
//
// Fault `microbatches_swapped`: stage 0 holds microbatch 1 back and sends it
// after microbatch 2, so stage 1 takes 2's activations for 1 and 1's for 2
// (a schedule's send order against its receive order). Needs pp >= 2.
#include <fmt/format.h>

#include <cmath>
#include <span>

#include "harness/core/error.h"
#include "harness/run/scenario.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "reference/ops.h"

namespace dc {
namespace {

constexpr std::size_t kLayers = 8, kMicrobatches = 4, kBatch = 64, kWidth = 256, kFfn = 1024;

std::string block_name(std::size_t i) { return fmt::format("layers.{}", i); }

// The weights of block i, rounded to the run's dtype (the reference computes
// in float64 on the same values).
struct BlockWeights {
  Tensor w1, b1, w2, b2;
};

BlockWeights weights(std::uint64_t seed, DType dtype, std::size_t i) {
  const std::string n = block_name(i);
  BlockWeights w{ref::generate(seed, n + ".fc1.weight", {kFfn, kWidth}, 1.0f / std::sqrt(float(kWidth))),
                 ref::generate(seed, n + ".fc1.bias", {kFfn}, 0.1f),
                 ref::generate(seed, n + ".fc2.weight", {kWidth, kFfn}, 0.5f / std::sqrt(float(kFfn))),
                 ref::generate(seed, n + ".fc2.bias", {kWidth}, 0.1f)};
  for (Tensor* t : {&w.w1, &w.b1, &w.w2, &w.b2}) round_to(dtype, t->data);
  return w;
}

// One block on rows x: (fc1's output, the block's output), each rounded as the run's dtype computes it.
template <class T>
std::pair<BasicTensor<T>, BasicTensor<T>> block(const BasicTensor<T>& x, const BlockWeights& w, DType dtype) {
  auto round = [&](BasicTensor<T>& t) {
    if constexpr (std::is_same_v<T, float>) round_to(dtype, t.data);
  };
  BasicTensor<T> h1 = ref::linear(x, w.w1, w.b1);  // float64 with float weights for the reference
  round(h1);
  BasicTensor<T> act = ref::gelu_tanh(h1);
  round(act);
  BasicTensor<T> f2 = ref::linear(act, w.w2, w.b2);
  round(f2);
  BasicTensor<T> out = ref::add(x, f2);
  round(out);
  return {std::move(h1), std::move(out)};
}

class MlpPipeline final : public Scenario {
 public:
  std::string name() const override { return "mlp_pp"; }
  std::string summary() const override {
    return "8 residual MLP blocks in pipeline stages over pp (GPipe, 4 microbatches), dp replicas of the "
           "pipeline; stage-owned taps, microbatches laid together";
  }
  std::vector<std::string> mesh_axes() const override { return {"pp", "dp"}; }
  std::vector<FaultSpec> faults() const override {
    FaultSpec swapped{"microbatches_swapped",
                      "stage 0 sends microbatch 1 after microbatch 2: stage 1 takes 2's activations for 1 and 1's "
                      "for 2 (found at stage 1's first block: layers.<8/pp>.fc1, microbatches 1 and 2)",
                      block_name(kLayers / 4) + ".fc1", {}, "pp >= 2",  // pp = 4: the default mesh of 4 and 16 ranks
                      [](const Mesh& m) { return m.axis_size("pp") >= 2; }};
    swapped.first_tap_on = [](const Mesh& m) {
      return block_name(kLayers / static_cast<std::size_t>(m.axis_size("pp"))) + ".fc1";
    };
    return {swapped};
  }
  std::string default_mesh(int world) const override {
    const int pp = world % 4 == 0 ? 4 : world % 2 == 0 ? 2 : 1;
    return fmt::format("pp={},dp={}", pp, world / pp);
  }
  void check_mesh(const Mesh& mesh, const std::string&) const override {
    if (mesh.axes().size() != 2 || mesh.axis_index("pp") != 0 || mesh.axis_index("dp") != 1)
      input_error("mlp_pp needs the axes pp, dp (in that order); got {}", mesh.str());
    const auto pp = static_cast<std::size_t>(mesh.axis_size("pp")), dp = static_cast<std::size_t>(mesh.axis_size("dp"));
    if (kLayers % pp)
      input_error("mlp_pp: its {} blocks do not split into pp = {} equal stages (pp: 1, 2, 4 or 8)", kLayers, pp);
    if (kBatch % (dp * kMicrobatches))
      input_error("mlp_pp: a batch of {} rows does not split into dp = {} replicas of {} microbatches", kBatch, dp,
                  kMicrobatches);
  }

  void run(RunContext& ctx) const override {
    const Mesh& mesh = ctx.mesh;
    const int rank = ctx.world.rank();
    const auto coords = mesh.coords(rank);
    const int pp = mesh.axis_size("pp"), stage = coords[0], dp_index = coords[1];
    const std::size_t per_stage = kLayers / static_cast<std::size_t>(pp);
    const std::size_t rows = kBatch / static_cast<std::size_t>(mesh.axis_size("dp")), mb_rows = rows / kMicrobatches;
    const Comm pipe = ctx.world.split(mesh, {"pp"});  // this replica's stages, in stage order

    // This stage's blocks, each microbatch's rows of each tap laid in order.
    const std::size_t first = static_cast<std::size_t>(stage) * per_stage;
    std::vector<BlockWeights> w;
    for (std::size_t i = first; i < first + per_stage; ++i) w.push_back(weights(ctx.seed, ctx.dtype, i));
    std::vector<Tensor> fc1(per_stage, Tensor({rows, kFfn})), out(per_stage, Tensor({rows, kWidth}));
    Tensor input;
    if (stage == 0) {
      input = ref::generate(ctx.seed, "x", {kBatch, kWidth}, 1.0f,
                            {{static_cast<std::size_t>(dp_index) * rows, static_cast<std::size_t>(dp_index + 1) * rows},
                             {0, kWidth}});
      round_to(ctx.dtype, input.data);
    }
    std::vector<Tensor> held;  // the fault: microbatch 1 waits for 2
    for (std::size_t m = 0; m < kMicrobatches; ++m) {
      Tensor x({mb_rows, kWidth});
      if (stage == 0)
        std::copy_n(input.data.begin() + static_cast<std::ptrdiff_t>(m * mb_rows * kWidth), x.size(), x.data.begin());
      else
        pipe.recv(std::span<float>(x.data), stage - 1);
      for (std::size_t j = 0; j < per_stage; ++j) {
        auto [h1, y] = block(x, w[j], ctx.dtype);
        std::copy(h1.data.begin(), h1.data.end(), fc1[j].data.begin() + static_cast<std::ptrdiff_t>(m * mb_rows * kFfn));
        std::copy(y.data.begin(), y.data.end(), out[j].data.begin() + static_cast<std::ptrdiff_t>(m * mb_rows * kWidth));
        x = std::move(y);
      }
      if (stage + 1 == pp) continue;
      if (stage == 0 && ctx.injected("microbatches_swapped") && m == 1) {
        held.push_back(std::move(x));
        continue;
      }
      pipe.send(std::span<const float>(x.data), stage + 1);
      for (const auto& h : held) pipe.send(std::span<const float>(h.data), stage + 1);
      held.clear();
    }

    // Taps: every rank records every block's, its own stage's values or zeros elsewhere (never read).
    for (std::size_t i = 0; i < kLayers; ++i) {
      const int owner = static_cast<int>(i / per_stage);
      Layout l = Layout::parse("dp,-", "");
      l.stage_axis = "pp";
      l.stage_index = owner;
      const bool mine = owner == stage;
      const double factor = std::sqrt(double(i + 1));  // the error of the blocks before it
      ctx.taps.tap(block_name(i) + ".fc1", mine ? std::move(fc1[i - first]) : Tensor({rows, kFfn}),
                   {.layout = l, .reduction_depth = long(kWidth + 1), .tolerance_factor = factor,
                    .microbatches = long(kMicrobatches)});
      ctx.taps.tap(block_name(i), mine ? std::move(out[i - first]) : Tensor({rows, kWidth}),
                   {.layout = l, .reduction_depth = long(kFfn + 1), .tolerance_factor = factor,
                    .microbatches = long(kMicrobatches)});
    }

    if (ctx.taps.is_reference_rank() && !ctx.taps.references_cached()) {
      const ReferenceClock clock(ctx.taps);
      Tensor x0 = ref::generate(ctx.seed, "x", {kBatch, kWidth}, 1.0f);
      round_to(ctx.dtype, x0.data);
      RefTensor x = ref::to_ref(x0);
      for (std::size_t i = 0; i < kLayers; ++i) {
        auto [h1, y] = block(x, weights(ctx.seed, ctx.dtype, i), ctx.dtype);
        ctx.taps.reference(block_name(i) + ".fc1", h1);
        ctx.taps.reference(block_name(i), y);
        x = std::move(y);
      }
    }
  }
};

}  // namespace

DIFFCHECK_REGISTER_SCENARIO(MlpPipeline)

}  // namespace dc
