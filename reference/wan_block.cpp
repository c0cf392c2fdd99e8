#include "reference/wan_block.h"

#include <cmath>

#include "reference/attention.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "reference/norms.h"
#include "reference/ops.h"

namespace dc::ref {
namespace {
constexpr double kEps = 1e-6;

// y = LN(x) * (1 + scale) + shift, with rows of `mod` as scale and shift.
template <class T>
BasicTensor<T> modulate(const BasicTensor<T>& ln, const BasicTensor<T>& mod, std::size_t shift_row,
                        std::size_t scale_row) {
  const std::size_t d = ln.shape.back();
  BasicTensor<T> y(ln.shape);
  for (std::size_t i = 0; i < ln.size(); ++i)
    y.data[i] = ln.data[i] * (T(1) + mod.data[scale_row * d + i % d]) + mod.data[shift_row * d + i % d];
  return y;
}

// y = x + a * gate (gate a row of `mod`)
template <class T>
BasicTensor<T> gated_add(const BasicTensor<T>& x, const BasicTensor<T>& a, const BasicTensor<T>& mod,
                         std::size_t gate_row) {
  const std::size_t d = x.shape.back();
  BasicTensor<T> y(x.shape);
  for (std::size_t i = 0; i < x.size(); ++i) y.data[i] = x.data[i] + a.data[i] * mod.data[gate_row * d + i % d];
  return y;
}
}  // namespace

std::vector<int> WanSizes::rope_axes() const {
  const int d = static_cast<int>(head_dim), s = d / 6;
  return {d - 4 * s, 2 * s, 2 * s};
}

template <class T>
WanWeights<T> make_wan_weights(std::uint64_t seed, const WanSizes& z, DType dtype) {
  const std::size_t d = z.dim, f = z.ffn;
  auto cvt = [&](Tensor t) { return as_run_values<T>(std::move(t), dtype); };
  auto lin = [&](const char* name, Shape s, std::size_t fan_in) {
    return cvt(generate(seed, name, s, 1.0f / std::sqrt(static_cast<float>(fan_in))));
  };
  auto gain = [&](const char* name) {
    Tensor g = generate(seed, name, {d}, 0.25f);
    for (auto& x : g.data) x += 1.0f;
    return cvt(g);
  };
  return WanWeights<T>{cvt(generate(seed, "table", {6, d}, 0.1f)),
                       lin("q.w", {d, d}, d), lin("q.b", {d}, d), lin("k.w", {d, d}, d), lin("k.b", {d}, d),
                       lin("v.w", {d, d}, d), lin("v.b", {d}, d), gain("norm_q"), gain("norm_k"),
                       lin("o.w", {d, d}, d), lin("o.b", {d}, d),
                       gain("norm2.g"), lin("norm2.b", {d}, d),
                       lin("cq.w", {d, d}, d), lin("cq.b", {d}, d), lin("ck.w", {d, d}, d), lin("ck.b", {d}, d),
                       lin("cv.w", {d, d}, d), lin("cv.b", {d}, d), gain("cnorm_q"), gain("cnorm_k"),
                       lin("co.w", {d, d}, d), lin("co.b", {d}, d),
                       lin("ffn1.w", {f, d}, d), lin("ffn1.b", {f}, d), lin("ffn2.w", {d, f}, f), lin("ffn2.b", {d}, f)};
}

RopeTable wan_rope(const WanSizes& z, const std::vector<std::size_t>& token_positions) {
  std::vector<std::vector<double>> pos;
  for (std::size_t n : token_positions) {
    const std::size_t w = n % z.width, h = (n / z.width) % z.height, f = n / (z.width * z.height);
    pos.push_back({double(f), double(h), double(w)});
  }
  return rope_table(pos, z.rope_axes());
}

template <class T>
WanPre<T> wan_pre_attention(const BasicTensor<T>& x, const BasicTensor<T>& e, const WanWeights<T>& w,
                            const WanSizes& z, const RopeTable& rope, const RoundFn<T>& round) {
  auto r = [&](BasicTensor<T> t) {
    round(t);
    return t;
  };
  const std::size_t n = x.shape[0];
  WanPre<T> p;
  p.mod = r(add(w.table, e));
  p.n1 = r(modulate(r(layer_norm(x, kEps)), p.mod, 0, 1));
  // RMSNorm across all heads (over d), then split into heads.
  auto qk = [&](const BasicTensor<T>& wt, const BasicTensor<T>& b, const BasicTensor<T>& g) {
    auto y = r(rms_norm(r(linear(p.n1, wt, b)), g, kEps));
    return r(apply_rope(reshape(y, {n, z.heads, z.head_dim}), rope));
  };
  p.q = qk(w.q_w, w.q_b, w.gq);
  p.k = qk(w.k_w, w.k_b, w.gk);
  const T scale = static_cast<T>(1.0 / std::sqrt(double(z.head_dim)));
  for (auto& v : p.k.data) v *= scale;
  p.k = r(p.k);
  p.v = reshape(r(linear(p.n1, w.v_w, w.v_b)), {n, z.heads, z.head_dim});
  return p;
}

template <class T>
WanPost<T> wan_post_attention(const BasicTensor<T>& x, const BasicTensor<T>& attn,
                              const BasicTensor<T>& mod, const BasicTensor<T>& enc,
                              const WanWeights<T>& w, const WanSizes& z, const RoundFn<T>& round) {
  auto r = [&](BasicTensor<T> t) {
    round(t);
    return t;
  };
  const std::size_t n = x.shape[0], l = enc.shape[0], d = z.dim;
  WanPost<T> p;
  p.x1 = r(gated_add(x, r(linear(attn, w.o_w, w.o_b)), mod, 2));
  // norm2: LayerNorm with affine parameters, no modulation.
  auto n2 = r(layer_norm(p.x1, kEps));
  for (std::size_t i = 0; i < n2.size(); ++i) n2.data[i] = n2.data[i] * w.n2_g.data[i % d] + w.n2_b.data[i % d];
  n2 = r(n2);
  // Cross-attention: same RMS qk-norm across heads, no RoPE, no gate.
  auto q = reshape(r(rms_norm(r(linear(n2, w.cq_w, w.cq_b)), w.cgq, kEps)), {n, z.heads, z.head_dim});
  auto k = reshape(r(rms_norm(r(linear(enc, w.ck_w, w.ck_b)), w.cgk, kEps)), {l, z.heads, z.head_dim});
  auto v = reshape(r(linear(enc, w.cv_w, w.cv_b)), {l, z.heads, z.head_dim});
  auto ca = reshape(r(attention(q, k, v, 1.0 / std::sqrt(double(z.head_dim)))), {n, d});
  p.x2 = r(add(p.x1, r(linear(ca, w.co_w, w.co_b))));
  auto n3 = r(modulate(r(layer_norm(p.x2, kEps)), mod, 3, 4));
  p.hidden = r(gelu_tanh(r(linear(n3, w.f1_w, w.f1_b))));
  p.out = r(gated_add(p.x2, r(linear(p.hidden, w.f2_w, w.f2_b)), mod, 5));
  return p;
}

#define DC_INSTANTIATE(T)                                                                           \
  template WanWeights<T> make_wan_weights<T>(std::uint64_t, const WanSizes&, DType);                \
  template WanPre<T> wan_pre_attention(const BasicTensor<T>&, const BasicTensor<T>&,                \
                                       const WanWeights<T>&, const WanSizes&, const RopeTable&,     \
                                       const RoundFn<T>&);                                          \
  template WanPost<T> wan_post_attention(const BasicTensor<T>&, const BasicTensor<T>&,              \
                                         const BasicTensor<T>&, const BasicTensor<T>&,              \
                                         const WanWeights<T>&, const WanSizes&, const RoundFn<T>&);
DC_INSTANTIATE(float)
DC_INSTANTIATE(double)
#undef DC_INSTANTIATE

}  // namespace dc::ref
