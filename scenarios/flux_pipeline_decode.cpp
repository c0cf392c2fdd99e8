// flux_pipeline's optional last stage (flag vae_decode): the final latents
// decoded into an image by vae_patch_decode's patch-parallel decoder
// (scenarios/vae_patch_decode_run.h), as multi-GPU pipelines decode after the
// loop. The ranks of a ring x sp group hold consecutive blocks of image
// tokens, i.e. (when ring x sp divides the token rows) horizontal strips of
// the latent image: the decode's tiles are those strips (ph = ring x sp,
// pw = 1), its halos travel between neighbouring strips, and a CFG pair, which
// holds the same latents after guidance, decodes them twice (replicas).
#include "harness/core/error.h"
#include "reference/nn.h"
#include "scenarios/flux_pipeline_run.h"
#include "scenarios/vae_patch_decode_run.h"

namespace dc::flux_pipeline {

ref::VaeSizes decode_sizes(const RunContext& ctx, const PipelineSizes& z) {
  ref::VaeSizes v = ref::VaeSizes::preset(ctx.size == "tiny" ? "tiny" : "default");
  v.batch = std::size_t(ctx.mesh.axis_size("dp"));
  v.latent_channels = z.channels;
  v.height = z.block.img_h;
  v.width = z.block.img_w;
  return v;
}

void check_decode_mesh(const Place& p, const PipelineSizes& z) {
  if (z.block.img_h % (p.ring * p.sp))
    input_error("flux_pipeline: --flag vae_decode decodes each rank's image tokens as whole rows of the {} x {} "
                "latent grid: ring x sp = {} must divide its {} rows", z.block.img_h, z.block.img_w, p.ring * p.sp,
                z.block.img_h);
}

void PipelineRun::decode_final(const Tensor& x, const RefTensor& x_ref) {
  const Place& p = place_;
  const ref::VaeSizes vz = decode_sizes(ctx_, z_);
  const std::size_t strips = p.ring * p.sp, rows = vz.height / strips, cols = vz.width, ch = vz.latent_channels;
  // Forced mode: the decode starts from the reference's final latents, so it
  // is judged on its own, as each step is.
  Tensor in = x;
  if (!free_) {
    in = ref::cast<float>(x_ref);
    round_(in);
  }
  // Token rows [rows x cols, C] -> the strip [1, C, rows, cols].
  auto to_image = [&](const auto& tokens, std::size_t height, auto& image) {
    for (std::size_t t = 0; t < height * cols; ++t)
      for (std::size_t c = 0; c < ch; ++c) image.data[c * height * cols + t] = tokens.data[t * ch + c];
  };
  Tensor strip({1, ch, rows, cols});
  to_image(in, rows, strip);
  const Mesh tiles({{"dp", int(p.dp * p.cfg)}, {"ph", int(strips)}, {"pw", 1}});
  vae::decode_tiles(ctx_, vz, vae::DecodeOptions{},
                    {tiles, seq_comm_, Layout::parse("dp,-,ring*sp,-", ""), Layout::parse("dp,-,-", ""), "decode/",
                     growth_},
                    std::move(strip));
  // The reference: the item's whole latents, gathered over ring x sp, decoded
  // by the first rank of its group (every rank or none: all agree on a hit).
  if (ctx_.taps.references_cached()) return;  // read from the reference cache
  const std::vector<double> all = seq_comm_.all_gather(std::span<const double>(x_ref.data));
  if (p.c != 0 || p.r != 0 || p.s != 0) return;
  const ReferenceClock clock(ctx_.taps);
  RefTensor latents({1, ch, vz.height, cols});
  to_image(RefTensor({vz.height * cols, ch}, all), vz.height, latents);
  vae::decode_reference(ctx_, vz, ref::make_vae_weights<double>(ctx_.seed, vz, ctx_.dtype), "decode/", p.b, latents);
}

}  // namespace dc::flux_pipeline
