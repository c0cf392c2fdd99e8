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
//
// This file declares the scenario; the run is flux_pipeline_run.{h,cpp} (the
// sharded loop) and flux_pipeline_reference.cpp (its reference).
#include <cstdlib>
#include <fmt/format.h>

#include "harness/core/error.h"
#include "harness/run/scenario.h"
#include "reference/flux_pipeline.h"
#include "scenarios/flux_pipeline_run.h"

namespace dc {
namespace {

using ref::PipelineSizes;

class FluxPipeline final : public Scenario {
 public:
  std::string name() const override { return "flux_pipeline"; }
  std::string summary() const override {
    return "FLUX-style DiT denoising loop (Euler steps: 28, 6 at size tiny; classifier-free guidance): prompts over 'dp', CFG "
           "branches over 'cfg', image tokens over 'ring' x 'sp' (USP, text replicated); every step checked";
  }
  std::vector<std::string> sizes() const override { return {"default", "tiny"}; }
  bool is_pipeline() const override { return true; }
  // The forced mode starts each step from the reference's latents: they are
  // kept with the references (PipelineRun::reference_step). Step caching is
  // not cacheable: the reference follows the sharded run's decisions, which a
  // fault can change.
  bool reference_cacheable(const FlagValues& flags) const override {
    const std::string& t = flags.get_string("cache_threshold");
    char* end = nullptr;
    const double threshold = std::strtod(t.c_str(), &end);
    return !t.empty() && *end == '\0' && threshold == 0.0;
  }
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
            {"merge", FlagType::string, "sigmoid", "LSE merge form: sigmoid or maxexp", {"sigmoid"}},
            {"cache_threshold", FlagType::string, "0",
             "TeaCache-style step caching: skip the blocks (reuse their last residual) while the accumulated "
             "relative L1 change of the first block's modulated input stays below this; 0 = off",
             {"0", "0.3"}},
            {"vae_decode", FlagType::boolean, "false",
             "decode the final latents into an image with vae_patch_decode's patch-parallel decoder (taps decode/...): "
             "each rank's image tokens are a strip of latent rows (ring x sp must divide them), halos between strips",
             {"false"}}};
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
             "step00/block0/attn", {}, "ring > 1", [](const Mesh& m) { return m.axis_size("ring") > 1; }, {}, {}, false,
             "each attention output A of the way from the right one to the rotated one"},
            {"timestep_temp_broadcast",
             "the sigma schedule is broadcast into a temporary: ranks other than 0 keep zeros (seeds/002 TP-2)",
             "schedule/sigmas", {}, "more than one rank", [](const Mesh& m) { return m.world_size() > 1; }},
            {"per_rank_cache_decision",
             "with step caching on, each rank decides from the change of its own image tokens instead of the "
             "whole sequence-parallel group's: ranks take different paths (some skip the blocks and their "
             "collectives) and the run hangs or desynchronizes (vllm-omni#6228)",
             "step01/cache/rel_l1", {"cache_threshold=0.3"}, "ring x sp > 1",
             [](const Mesh& m) { return m.axis_size("ring") * m.axis_size("sp") > 1; }, {}, {}, true}};
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

  void run(RunContext& ctx) const override { flux_pipeline::PipelineRun(ctx).go(); }
};


}  // namespace

DIFFCHECK_REGISTER_SCENARIO(FluxPipeline)

}  // namespace dc
