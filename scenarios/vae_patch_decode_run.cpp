#include "scenarios/vae_patch_decode_run.h"

#include <algorithm>
#include <cmath>

#include "harness/core/layout.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "reference/vae_decoder.h"

namespace dc::vae {
namespace {

using ref::PixelRect;
using ref::VaeSizes;

class PatchDecode {
 public:
  PatchDecode(RunContext& ctx, const VaeSizes& z, const DecodeOptions& o, const DecodePlace& where)
      : ctx_(ctx), z_(z), o_(o), at_(where), group_(where.patch_group),
        halo_(where.tiles, ctx.world, where.patch_group, o.halo, o.faults),
        w_(ref::make_vae_weights<float>(ctx.seed, z, ctx.dtype)) {}

  void go(Tensor latents) {
    tap("latents", latents, 0);
    const Tensor h0 = conv("conv_in", latents, w_.conv_in);
    Tensor h = norm("res0/norm1", h0, w_.res_norm1);
    h = conv("res0/conv1", h, w_.res_conv1);
    h = norm("res0/norm2", h, w_.res_norm2);
    h = conv("res0/conv2", h, w_.res_conv2);
    for (std::size_t i = 0; i < h.data.size(); ++i) h.data[i] += h0.data[i];
    round_to(ctx_.dtype, h.data);
    tap("res0/out", h, depth_);
    h = conv("up0/conv", ref::upsample2(h), w_.up0_conv);
    h = conv("up1/conv", ref::upsample2(h), w_.up1_conv);
    h = norm("norm_out", h, w_.norm_out);
    conv("image", h, w_.conv_out, "nchw");
  }

 private:
  void tap(const std::string& name, const Tensor& t, long depth, const std::string& image = "") {
    ctx_.taps.tap(at_.prefix + name, t,
                  {.layout = at_.tile_layout, .reduction_depth = depth, .tolerance_factor = at_.tolerance_factor,
                   .image = image});
  }

  // conv3x3 of the tile with its neighbours' halos. With overlap, the interior
  // (the pixels whose 3x3 window stays inside the tile) is computed while the
  // halos travel, the border pixels after they arrived.
  Tensor conv(const std::string& name, const Tensor& x, const ref::Conv3x3<float>& c, const std::string& image = "") {
    const std::size_t n = x.shape[0], h = x.shape[2], w = x.shape[3];
    PendingHalo p = halo_.start(x);
    Tensor out({n, c.cout(), h, w});
    auto each_item = [&](PixelRect r) {
      for (std::size_t b = 0; b < n; ++b)
        ref::conv3x3_rect(p.padded.data.data() + b * c.cin() * (h + 2) * (w + 2), h, w, c,
                          out.data.data() + b * c.cout() * h * w, r);
    };
    if (o_.overlap) {
      if (h > 2 && w > 2) each_item({1, h - 1, 1, w - 1});
      halo_.finish(p);
      each_item({0, 1, 0, w});                                   // top row
      if (h > 1) each_item({h - 1, h, 0, w});                    // bottom row
      if (h > 2) each_item({1, h - 1, 0, 1});                    // left column
      if (h > 2 && w > 1) each_item({1, h - 1, w - 1, w});       // right column
    } else {
      halo_.finish(p);
      each_item({0, h, 0, w});
    }
    round_to(ctx_.dtype, out.data);
    depth_ += long(9 * c.cin());
    tap(name, out, depth_, image);
    return out;
  }

  // GroupNorm + SiLU with the statistics of the whole image: this tile's
  // partial statistics reduced over the patch group.
  Tensor norm(const std::string& name, Tensor x, const ref::GroupNormParams<float>& p) {
    const std::size_t n = x.shape[0], ch = x.shape[1], hw = x.shape[2] * x.shape[3], groups = z_.groups;
    const std::size_t per = ch / groups, local = per * hw;
    const double total = o_.local_stats ? double(local) : double(local * std::size_t(group_.size()));
    Tensor stats({n, groups, 2});
    auto group_values = [&](std::size_t b, std::size_t g) { return x.data.data() + (b * ch + g * per) * hw; };
    if (!o_.welford) {
      std::vector<double> sums(n * groups * 2);
      for (std::size_t b = 0; b < n; ++b)
        for (std::size_t g = 0; g < groups; ++g) {
          const float* v = group_values(b, g);
          double s = 0, sq = 0;
          for (std::size_t i = 0; i < local; ++i) s += v[i], sq += double(v[i]) * v[i];
          sums[(b * groups + g) * 2] = s;
          sums[(b * groups + g) * 2 + 1] = sq;
        }
      if (!o_.local_stats) group_.all_reduce_sum(std::span<double>(sums));
      for (std::size_t k = 0; k < n * groups; ++k) {
        const double mean = sums[2 * k] / total;
        stats.data[2 * k] = float(mean);
        stats.data[2 * k + 1] = float(std::max(sums[2 * k + 1] / total - mean * mean, 0.0));
      }
    } else {
      // Welford per tile, then Chan et al.'s merge of the states in rank order.
      std::vector<double> state(n * groups * 3);
      for (std::size_t b = 0; b < n; ++b)
        for (std::size_t g = 0; g < groups; ++g) {
          const float* v = group_values(b, g);
          double mean = 0, m2 = 0;
          for (std::size_t i = 0; i < local; ++i) {
            const double d = v[i] - mean;
            mean += d / double(i + 1);
            m2 += d * (v[i] - mean);
          }
          double* s = &state[(b * groups + g) * 3];
          s[0] = double(local), s[1] = mean, s[2] = m2;
        }
      std::vector<double> all =
          o_.local_stats ? state : group_.all_gather(std::span<const double>(state));
      const std::size_t ranks = all.size() / state.size();
      for (std::size_t k = 0; k < n * groups; ++k) {
        double cnt = 0, mean = 0, m2 = 0;
        for (std::size_t r = 0; r < ranks; ++r) {
          const double* s = &all[r * state.size() + 3 * k];
          const double merged = cnt + s[0], delta = s[1] - mean;
          mean += delta * s[0] / merged;
          m2 += s[2] + delta * delta * cnt * s[0] / merged;
          cnt = merged;
        }
        stats.data[2 * k] = float(mean);
        stats.data[2 * k + 1] = float(m2 / cnt);
      }
    }
    Tensor tapped = stats;
    round_to(ctx_.dtype, tapped.data);
    ctx_.taps.tap(at_.prefix + name + "/stats", tapped,
                  {.layout = at_.stats_layout, .reduction_depth = long(total), .tolerance_factor = at_.tolerance_factor});
    ref::group_norm_silu(x, stats, p);
    round_to(ctx_.dtype, x.data);
    tap(name + "/out", x, depth_);
    return x;
  }

  RunContext& ctx_;
  const VaeSizes& z_;
  const DecodeOptions& o_;
  const DecodePlace& at_;
  const Comm& group_;
  HaloExchange halo_;
  ref::VaeDecoderWeights<float> w_;
  long depth_ = 0;
};

}  // namespace

void decode_tiles(RunContext& ctx, const VaeSizes& z, const DecodeOptions& o, const DecodePlace& where,
                  Tensor latents) {
  PatchDecode(ctx, z, o, where).go(std::move(latents));
}

void decode_reference(RunContext& ctx, const VaeSizes& z, const ref::VaeDecoderWeights<double>& w,
                      const std::string& prefix, std::size_t item, const RefTensor& latents) {
  ref::vae_decode<double>(latents, w, z.groups, [&](const std::string& name, const RefTensor& t) {
    const Shape item_shape(t.shape.begin() + 1, t.shape.end());
    ctx.taps.reference_row(prefix + name, z.batch, item, RefTensor(item_shape, t.data));
  });
}

DecodeOptions DecodeOptions::from(const RunContext& ctx) {
  DecodeOptions o;
  o.halo = ctx.flags.get_string("halo") == "allgather" ? HaloMode::allgather : HaloMode::p2p;
  o.welford = ctx.flags.get_string("gn_stats") == "welford";
  o.overlap = ctx.flags.get_bool("overlap");
  o.faults = {.wrong_peer = ctx.injected("halo_wrong_peer"), .dropped = ctx.injected("halo_dropped"),
              .corners_missing = ctx.injected("halo_corner_missing")};
  o.local_stats = ctx.injected("gn_local_stats");
  return o;
}

void run_patch_decode(RunContext& ctx) {
  const VaeSizes z = VaeSizes::preset(ctx.size);
  const DecodeOptions o = DecodeOptions::from(ctx);
  const Mesh& mesh = ctx.mesh;
  const int rank = ctx.world.rank();
  const std::size_t dp = std::size_t(mesh.axis_size("dp")), ph = std::size_t(mesh.axis_size("ph")),
                    pw = std::size_t(mesh.axis_size("pw"));
  const std::size_t bl = z.batch / dp, h = z.height / ph, w = z.width / pw;
  const std::size_t b0 = std::size_t(mesh.index_in(rank, {"dp"})) * bl,
                    r0 = std::size_t(mesh.index_in(rank, {"ph"})) * h, c0 = std::size_t(mesh.index_in(rank, {"pw"})) * w;
  const Comm group = ctx.world.split(mesh, {"ph", "pw"});
  Tensor latents = ref::generate(ctx.seed, "vae.latents", {z.batch, z.latent_channels, z.height, z.width}, 1.0f,
                                 {{b0, b0 + bl}, {0, z.latent_channels}, {r0, r0 + h}, {c0, c0 + w}});
  round_to(ctx.dtype, latents.data);
  decode_tiles(ctx, z, o,
               {ctx.mesh, group, Layout::parse("dp,-,ph,pw", ""), Layout::parse("dp,-,-", ""), "", 1.0},
               std::move(latents));
  // The float64 reference of every item, each computed by one rank (items
  // spread over the ranks).
  if (ctx.taps.references_cached()) return;  // read from the reference cache
  const ReferenceClock clock(ctx.taps);
  const auto weights = ref::make_vae_weights<double>(ctx.seed, z, ctx.dtype);
  const Shape global{z.batch, z.latent_channels, z.height, z.width};
  for (std::size_t b : ctx.taps.my_reference_rows(z.batch)) {
    const Tensor item = ref::generate(ctx.seed, "vae.latents", global, 1.0f,
                                      {{b, b + 1}, {0, z.latent_channels}, {0, z.height}, {0, z.width}});
    decode_reference(ctx, z, weights, "", b, ref::to_ref(item));
  }
}

}  // namespace dc::vae
