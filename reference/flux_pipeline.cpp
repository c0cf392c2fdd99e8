#include "reference/flux_pipeline.h"

#include <algorithm>
#include <cmath>

#include "harness/core/error.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "reference/norms.h"
#include "reference/ops.h"
#include "reference/timestep.h"

namespace dc::ref {

PipelineSizes PipelineSizes::preset(const std::string& name) {
  PipelineSizes z;
  if (name == "tiny") {
    z.block = {64, 4, 16, 256, 8, 4, 8, {4, 6, 6}};
    z.steps = 6;
    return z;
  }
  if (name != "default") fail("flux_pipeline has no size '{}'", name);
  z.block = {128, 8, 16, 512, 16, 8, 16, {4, 6, 6}};
  z.freq_dim = 128;
  return z;
}

template <class T>
PipelineWeights<T> make_pipeline_weights(std::uint64_t seed, const PipelineSizes& z, DType dtype,
                                         const GenerateBlock& gen_block) {
  const std::size_t d = z.block.dim, c = z.channels, f = static_cast<std::size_t>(z.freq_dim);
  auto gen = [&](const std::string& name, Shape s, std::size_t fan_in) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(fan_in));
    return as_run_values<T>(gen_block ? gen_block(name, s, scale, {}) : generate(seed, name, s, scale), dtype);
  };
  PipelineWeights<T> w{gen("img_in.w", {d, c}, c),        gen("img_in.b", {d}, c),
                       gen("txt_in.w", {d, d}, d),        gen("txt_in.b", {d}, d),
                       gen("time.l1.w", {d, f}, f),       gen("time.l1.b", {d}, f),
                       gen("time.l2.w", {d, d}, d),       gen("time.l2.b", {d}, d),
                       gen("pooled.w", {d, d}, d),        gen("pooled.b", {d}, d),
                       gen("norm_out.w", {2 * d, d}, d),  gen("norm_out.b", {2 * d}, d),
                       gen("proj.w", {c, d}, d),          gen("proj.b", {c}, d),
                       {}};
  for (std::size_t k = 0; k < z.blocks; ++k)
    w.blocks.push_back(make_flux_weights<T>(seed, z.block, 1, 0, false, dtype, gen_block, "block" + std::to_string(k) + "."));
  return w;
}

template <class T>
BasicTensor<T> pipeline_temb(double timestep, const BasicTensor<T>& pooled, const PipelineWeights<T>& w,
                             const PipelineSizes& z, const Round<T>& round) {
  auto r = [&](BasicTensor<T> x) {
    round(x);
    return x;
  };
  auto sin = r(with_batch_dim(timestep_sinusoid<T>(timestep, z.freq_dim)));
  auto t = r(linear(r(silu(r(linear(sin, w.time1_w, w.time1_b)))), w.time2_w, w.time2_b));
  auto p = r(linear(reshape(pooled, {1, pooled.size()}), w.pooled_w, w.pooled_b));
  return r(add(t, p));
}

template <class T>
BasicTensor<T> embed_tokens(const BasicTensor<T>& x, const BasicTensor<T>& txt, const PipelineWeights<T>& w,
                            const Round<T>& round) {
  auto r = [&](BasicTensor<T> t) {
    round(t);
    return t;
  };
  return concat_rows(r(linear(txt, w.txt_in_w, w.txt_in_b)), r(linear(x, w.img_in_w, w.img_in_b)));
}

template <class T>
BasicTensor<T> run_blocks(BasicTensor<T> h, const BasicTensor<T>& temb, const PipelineWeights<T>& w,
                          const PipelineSizes& z, const RopeTable& rope, const AttendFn<T>& attend, const Round<T>& round,
                          const BlockObserver<T>& observe) {
  if (rope.cos.shape[0] != h.shape[0]) fail("run_blocks: {} RoPE rows for {} tokens", rope.cos.shape[0], h.shape[0]);
  for (std::size_t k = 0; k < w.blocks.size(); ++k) {
    auto a = flux_pre_attention(h, temb, w.blocks[k], z.block, rope, round);
    auto attn = attend(k, a.q, a.k, a.v);
    flux_post_attention(a, std::move(attn), w.blocks[k], true, round);
    h = gated_residual(a.partial, a.ada, h);
    round(h);
    if (observe) observe(k, a, h);
  }
  return h;
}

template <class T>
BasicTensor<T> final_layer(const BasicTensor<T>& h, std::size_t text, const BasicTensor<T>& temb,
                           const PipelineWeights<T>& w, const PipelineSizes& z, const Round<T>& round) {
  auto r = [&](BasicTensor<T> t) {
    round(t);
    return t;
  };
  const std::size_t n = h.shape[0] - text, d = z.block.dim;
  // AdaLayerNormContinuous: (scale, shift) = Linear(SiLU(temb)); norm(h) (1 + scale) + shift.
  auto emb = r(linear(r(silu(temb)), w.norm_out_w, w.norm_out_b));
  auto ln = r(layer_norm(take_rows(h, text, text + n), 1e-6));
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < d; ++j) ln.data[i * d + j] = ln.data[i * d + j] * (T(1) + emb.data[j]) + emb.data[d + j];
  return r(linear(r(ln), w.out_w, w.out_b));
}

template <class T>
BasicTensor<T> flux_velocity(const BasicTensor<T>& x, const BasicTensor<T>& txt, const BasicTensor<T>& temb,
                             const PipelineWeights<T>& w, const PipelineSizes& z, const RopeTable& rope,
                             const AttendFn<T>& attend, const Round<T>& round, const BlockObserver<T>& observe) {
  auto h = run_blocks(embed_tokens(x, txt, w, round), temb, w, z, rope, attend, round, observe);
  return final_layer(h, txt.shape[0], temb, w, z, round);
}

template <class T>
BasicTensor<T> cfg_combine(const BasicTensor<T>& v_cond, const BasicTensor<T>& v_uncond, double g,
                           const Round<T>& round) {
  if (v_cond.shape != v_uncond.shape)
    fail("cfg_combine: branches of shapes {} and {}", shape_str(v_cond.shape), shape_str(v_uncond.shape));
  BasicTensor<T> diff(v_cond.shape), out(v_cond.shape);
  for (std::size_t i = 0; i < diff.size(); ++i) diff.data[i] = v_cond.data[i] - v_uncond.data[i];
  round(diff);
  for (std::size_t i = 0; i < diff.size(); ++i) diff.data[i] = static_cast<T>(g * diff.data[i]);
  round(diff);
  for (std::size_t i = 0; i < out.size(); ++i) out.data[i] = v_uncond.data[i] + diff.data[i];
  round(out);
  return out;
}

template <class T>
BasicTensor<T> euler_step(const BasicTensor<T>& x, const BasicTensor<T>& v, double sigma, double sigma_next,
                          const Round<T>& round) {
  if (x.shape != v.shape) fail("euler_step: latents {} and velocity {}", shape_str(x.shape), shape_str(v.shape));
  const T dt = static_cast<T>(sigma_next - sigma);
  BasicTensor<T> out(x.shape);
  for (std::size_t i = 0; i < out.size(); ++i) out.data[i] = x.data[i] + dt * v.data[i];
  round(out);
  return out;
}

template <class T>
BasicTensor<T> latents_to_rgb(const BasicTensor<T>& x) {
  // Rows: latent channels; columns: R, G, B.
  static constexpr double kToRgb[4][3] = {
      {0.298, 0.207, 0.208}, {0.187, 0.286, 0.173}, {-0.158, 0.189, 0.264}, {-0.184, -0.271, -0.473}};
  if (x.rank() != 2 || x.shape[1] != 16) fail("latents_to_rgb: latents {} are not [tokens, 4 x 2 x 2]", shape_str(x.shape));
  const std::size_t n = x.shape[0];
  BasicTensor<T> rgb({n, 2, 2, 3});
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t dy = 0; dy < 2; ++dy)
      for (std::size_t dx = 0; dx < 2; ++dx)
        for (std::size_t c = 0; c < 3; ++c) {
          double v = 0;
          for (std::size_t k = 0; k < 4; ++k) v += kToRgb[k][c] * double(x.data[i * 16 + 4 * k + 2 * dy + dx]);
          rgb.data[((i * 2 + dy) * 2 + dx) * 3 + c] = static_cast<T>(std::clamp((v + 1.0) / 2.0, 0.0, 1.0));
        }
  return rgb;
}

#define DC_INSTANTIATE(T)                                                                                       \
  template PipelineWeights<T> make_pipeline_weights<T>(std::uint64_t, const PipelineSizes&, DType,              \
                                                       const GenerateBlock&);                                   \
  template BasicTensor<T> pipeline_temb(double, const BasicTensor<T>&, const PipelineWeights<T>&,               \
                                        const PipelineSizes&, const Round<T>&);                                 \
  template BasicTensor<T> flux_velocity(const BasicTensor<T>&, const BasicTensor<T>&, const BasicTensor<T>&,    \
                                        const PipelineWeights<T>&, const PipelineSizes&, const RopeTable&,      \
                                        const AttendFn<T>&, const Round<T>&, const BlockObserver<T>&);          \
  template BasicTensor<T> embed_tokens(const BasicTensor<T>&, const BasicTensor<T>&, const PipelineWeights<T>&,    \
                                       const Round<T>&);                                                          \
  template BasicTensor<T> run_blocks(BasicTensor<T>, const BasicTensor<T>&, const PipelineWeights<T>&,            \
                                     const PipelineSizes&, const RopeTable&, const AttendFn<T>&, const Round<T>&, \
                                     const BlockObserver<T>&);                                                    \
  template BasicTensor<T> final_layer(const BasicTensor<T>&, std::size_t, const BasicTensor<T>&,                  \
                                      const PipelineWeights<T>&, const PipelineSizes&, const Round<T>&);          \
  template BasicTensor<T> cfg_combine(const BasicTensor<T>&, const BasicTensor<T>&, double, const Round<T>&);   \
  template BasicTensor<T> latents_to_rgb(const BasicTensor<T>&);                                                 \
  template BasicTensor<T> euler_step(const BasicTensor<T>&, const BasicTensor<T>&, double, double,              \
                                     const Round<T>&);
DC_INSTANTIATE(float)
DC_INSTANTIATE(double)
#undef DC_INSTANTIATE

}  // namespace dc::ref
