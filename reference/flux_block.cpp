#include "reference/flux_block.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "harness/core/error.h"

#include "reference/attention.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "reference/norms.h"

namespace dc::ref {
namespace {
constexpr double kEps = 1e-6;
}

FluxSizes FluxSizes::preset(const std::string& name) {
  if (name == "flux1-dev") return {3072, 24, 128, 12288, 512, 64, 64, {16, 56, 56}};
  return {256, 16, 16, 1024, 32, 14, 16, {4, 6, 6}};  // RoPE axes scaled down: a guess
}

ColumnRanges proj_out_columns(const FluxSizes& z, std::size_t w, std::size_t i, bool contiguous) {
  if (contiguous) {
    const std::size_t width = (z.dim + z.mlp) / w;
    return {{i * width, (i + 1) * width}};
  }
  return {{i * z.dim / w, (i + 1) * z.dim / w},
          {z.dim + i * z.mlp / w, z.dim + (i + 1) * z.mlp / w}};
}

ColumnRanges packed_columns(const FluxSizes& z, std::size_t w) {
  ColumnRanges all;
  for (std::size_t i = 0; i < w; ++i)
    for (auto r : proj_out_columns(z, w, i, false)) all.push_back(r);
  return all;
}

Tensor proj_out_weight(std::uint64_t seed, const FluxSizes& z, const Ranges& block, const GenerateBlock& gen,
                       const std::string& prefix) {
  const std::string name = prefix + "proj_out.w";
  const Shape global{z.dim, z.dim + z.mlp};
  const float scale = 1.0f / std::sqrt(static_cast<float>(z.dim + z.mlp));
  return gen ? gen(name, global, scale, block) : ref::generate(seed, name, global, scale, block);
}

template <class T>
FluxWeights<T> make_flux_weights(std::uint64_t seed, const FluxSizes& z, std::size_t w,
                                 std::size_t i, bool contiguous, DType dtype, const GenerateBlock& gen_block,
                                 const std::string& prefix) {
  const std::size_t d = z.dim, m = z.mlp;
  auto generate = [&](const char* name, const Shape& s, float scale, const Ranges& block = {}) {
    const std::string full_name = prefix + name;
    return gen_block ? gen_block(full_name, s, scale, block) : ref::generate(seed, full_name, s, scale, block);
  };
  auto cvt = [&](Tensor t) { return as_run_values<T>(std::move(t), dtype); };
  auto scale = [](std::size_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
  auto full = [&](const char* name, Shape s, std::size_t fan_in) {
    return cvt(generate(name, s, scale(fan_in)));
  };
  // Column-parallel: rows [i*n/w, (i+1)*n/w) of an [n, fan_in] weight, and of its bias.
  auto rows = [&](const char* name, std::size_t n, std::size_t fan_in) {
    return cvt(generate(name, {n, fan_in}, scale(fan_in), {{i * n / w, (i + 1) * n / w}, {0, fan_in}}));
  };
  auto bias_rows = [&](const char* name, std::size_t n, std::size_t fan_in) {
    return cvt(generate(name, {n}, scale(fan_in), {{i * n / w, (i + 1) * n / w}}));
  };
  auto gain = [&](const char* name) {  // RMSNorm weights near 1
    Tensor g = generate(name, {z.head_dim}, 0.25f);
    for (auto& x : g.data) x += 1.0f;
    return cvt(g);
  };
  // Row-parallel proj_out: this rank's columns of [d, d+m], packed side by side.
  Tensor out_cols;
  for (auto [a, b] : proj_out_columns(z, w, i, contiguous)) {
    Tensor block = proj_out_weight(seed, z, {{0, d}, {a, b}}, gen_block, prefix);
    out_cols = out_cols.size() ? concat_last(out_cols, block) : block;
  }
  return FluxWeights<T>{full("adaln.w", {3 * d, d}, d), full("adaln.b", {3 * d}, d),
                        rows("q.w", d, d),   bias_rows("q.b", d, d),
                        rows("k.w", d, d),   bias_rows("k.b", d, d),
                        rows("v.w", d, d),   bias_rows("v.b", d, d),
                        rows("mlp.w", m, d), bias_rows("mlp.b", m, d),
                        gain("norm_q.w"),    gain("norm_k.w"),
                        cvt(out_cols),       full("proj_out.b", {d}, d + m)};
}

RopeTable flux_rope(const FluxSizes& z) {
  std::vector<std::size_t> all(z.tokens());
  for (std::size_t t = 0; t < all.size(); ++t) all[t] = t;
  return flux_rope_rows(z, all);
}

RopeTable flux_rope_rows(const FluxSizes& z, const std::vector<std::size_t>& tokens) {
  std::vector<std::vector<double>> pos;
  for (std::size_t t : tokens) {
    if (t >= z.tokens()) fail("flux_rope_rows: token {} of a {}-token sequence", t, z.tokens());
    if (t < z.txt) {
      pos.push_back({0, 0, 0});
    } else {
      const std::size_t img = t - z.txt;
      pos.push_back({0, double(img / z.img_w), double(img % z.img_w)});
    }
  }
  return rope_table(pos, z.rope_axes);
}

template <class T, class W>
std::pair<BasicTensor<T>, BasicTensor<T>> flux_modulated_input(const BasicTensor<T>& h, const BasicTensor<T>& temb,
                                                               const FluxWeights<W>& w, const FluxSizes& z,
                                                               const std::function<void(BasicTensor<T>&)>& round) {
  auto r = [&](BasicTensor<T> x) {
    round(x);
    return x;
  };
  const std::size_t n = h.shape[0], d = z.dim;
  BasicTensor<T> ada = r(linear(r(silu(temb)), w.ada_w, w.ada_b));
  auto ln = r(layer_norm(h, kEps));
  BasicTensor<T> nx(ln.shape);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t j = 0; j < d; ++j) nx.data[t * d + j] = ln.data[t * d + j] * (T(1) + ada.data[d + j]) + ada.data[j];
  return {std::move(ada), r(std::move(nx))};
}

template <class T, class W>
FluxActivations<T> flux_pre_attention(const BasicTensor<T>& h, const BasicTensor<T>& temb, const FluxWeights<W>& w,
                                      const FluxSizes& z, const RopeTable& rope,
                                      const std::function<void(BasicTensor<T>&)>& round, FluxWeights<W>* give_up) {
  // Each weight given up (when asked: give_up is w itself) right after its
  // last use, and never read again below.
  auto drop = [&](auto... member) {
    if (give_up) ((give_up->*member = BasicTensor<W>()), ...);
  };
  auto r = [&](BasicTensor<T> x) {
    round(x);
    return x;
  };
  const std::size_t n = h.shape[0];
  if (rope.cos.shape[0] != n) fail("flux_pre_attention: {} RoPE rows for {} tokens", rope.cos.shape[0], n);
  FluxActivations<T> a;
  using Wt = FluxWeights<W>;
  std::tie(a.ada, a.nx) = flux_modulated_input(h, temb, w, z, round);
  drop(&Wt::ada_w, &Wt::ada_b);
  a.mlp = r(gelu_tanh(r(linear(a.nx, w.mlp_w, w.mlp_b))));
  drop(&Wt::mlp_w, &Wt::mlp_b);
  const std::size_t heads = w.q_w.shape[0] / z.head_dim;
  auto project = [&](const BasicTensor<W>& wt, const BasicTensor<W>& b) {
    return reshape(r(linear(a.nx, wt, b)), {n, heads, z.head_dim});
  };
  a.q = r(apply_rope(r(rms_norm(project(w.q_w, w.q_b), w.gq, kEps)), rope));
  drop(&Wt::q_w, &Wt::q_b, &Wt::gq);
  a.k = r(apply_rope(r(rms_norm(project(w.k_w, w.k_b), w.gk, kEps)), rope));
  drop(&Wt::k_w, &Wt::k_b, &Wt::gk);
  a.v = project(w.v_w, w.v_b);
  drop(&Wt::v_w, &Wt::v_b);
  return a;
}

namespace {

// After attention: the packed proj_out input and its product, through
// `product(cat)` (the proj_out linear, with or without its bias).
template <class T, class Product>
void post_attention(FluxActivations<T>& a, BasicTensor<T> attn, Product&& product,
                    const std::function<void(BasicTensor<T>&)>& round) {
  const std::size_t n = attn.shape[0], width = attn.size() / std::max<std::size_t>(n, 1);
  a.attn = reshape(std::move(attn), {n, width});
  a.cat = concat_last(a.attn, a.mlp);
  a.partial = product(a.cat);
  round(a.partial);
}

}  // namespace

template <class T, class W>
void flux_post_attention(FluxActivations<T>& a, BasicTensor<T> attn, const FluxWeights<W>& w, bool add_bias,
                         const std::function<void(BasicTensor<T>&)>& round) {
  post_attention(a, std::move(attn),
                 [&](const BasicTensor<T>& cat) { return linear(cat, w.out_w, add_bias ? w.out_b : BasicTensor<W>()); },
                 round);
}

namespace {

// The forward, with the caller's say between its parts: `after_pre()` once
// the token-local part before attention is done, and `product(cat)` for
// proj_out's product once attention is.
template <class T, class W, class AfterPre, class Product>
FluxActivations<T> forward_in_parts(const BasicTensor<T>& h, const BasicTensor<T>& temb, const FluxWeights<W>& w,
                                    const FluxSizes& z, const RopeTable& all_rope,
                                    const std::function<void(BasicTensor<T>&)>& round, std::size_t first_token,
                                    const GatherTokens<T>& gather, FluxWeights<W>* give_up, AfterPre&& after_pre,
                                    Product&& product) {
  const std::size_t n = h.shape[0];
  if (first_token + n > all_rope.cos.shape[0] || (n != all_rope.cos.shape[0] && !gather))
    fail("flux_block_forward: tokens [{}, {}) of a {}-token sample{}", first_token, first_token + n,
         all_rope.cos.shape[0], gather ? "" : " without a way to gather the others' k and v");
  const RopeTable rope{take_rows(all_rope.cos, first_token, first_token + n),
                       take_rows(all_rope.sin, first_token, first_token + n)};
  FluxActivations<T> a = flux_pre_attention(h, temb, w, z, rope, round, give_up);
  after_pre();
  const double scale = 1.0 / std::sqrt(double(z.head_dim));
  BasicTensor<T> attn = gather ? attention(a.q, gather(a.k), gather(a.v), scale) : attention(a.q, a.k, a.v, scale);
  round(attn);
  post_attention(a, std::move(attn), product, round);
  return a;
}

}  // namespace

template <class T, class W>
FluxActivations<T> flux_block_forward(const BasicTensor<T>& h, const BasicTensor<T>& temb,
                                      const FluxWeights<W>& w, const FluxSizes& z,
                                      const RopeTable& all_rope, bool add_bias,
                                      const std::function<void(BasicTensor<T>&)>& round,
                                      std::size_t first_token, const GatherTokens<T>& gather) {
  return forward_in_parts(
      h, temb, w, z, all_rope, round, first_token, gather, static_cast<FluxWeights<W>*>(nullptr), [] {},
      [&](const BasicTensor<T>& cat) { return linear(cat, w.out_w, add_bias ? w.out_b : BasicTensor<W>()); });
}

template <class T, class W>
FluxActivations<T> flux_block_forward_lean(const BasicTensor<T>& h, const BasicTensor<T>& temb, FluxWeights<W>&& w,
                                           const OutWeightRows<W>& out_w_rows, const FluxSizes& z,
                                           const RopeTable& all_rope, bool add_bias,
                                           const std::function<void(BasicTensor<T>&)>& round,
                                           std::size_t first_token, const GatherTokens<T>& gather) {
  BasicTensor<W> out_b;
  return forward_in_parts(
      h, temb, w, z, all_rope, round, first_token, gather, &w,
      [&] {
        out_b = std::move(w.out_b);
        w = {};
      },
      [&](const BasicTensor<T>& cat) {
        return linear_by_rows<T, W>(cat, z.dim, out_w_rows, add_bias ? out_b : BasicTensor<W>());
      });
}

template <class T>
BasicTensor<T> gated_residual(const BasicTensor<T>& y, const BasicTensor<T>& ada,
                              const BasicTensor<T>& h) {
  const std::size_t d = h.shape.back();
  BasicTensor<T> out(h.shape);
  for (std::size_t i = 0; i < h.size(); ++i)
    out.data[i] = ada.data[2 * d + i % d] * y.data[i] + h.data[i];
  return out;
}

#define DC_INSTANTIATE(T)                                                                       \
  template FluxWeights<T> make_flux_weights<T>(std::uint64_t, const FluxSizes&, std::size_t,    \
                                               std::size_t, bool, DType, const GenerateBlock&,  \
                                               const std::string&);                             \
  template BasicTensor<T> gated_residual(const BasicTensor<T>&, const BasicTensor<T>&,          \
                                         const BasicTensor<T>&);
DC_INSTANTIATE(float)
DC_INSTANTIATE(double)
#undef DC_INSTANTIATE

#define DC_INSTANTIATE_FORWARD(T, W)                                                            \
  template std::pair<BasicTensor<T>, BasicTensor<T>> flux_modulated_input(                      \
      const BasicTensor<T>&, const BasicTensor<T>&, const FluxWeights<W>&, const FluxSizes&,    \
      const std::function<void(BasicTensor<T>&)>&);                                             \
  template FluxActivations<T> flux_pre_attention(const BasicTensor<T>&, const BasicTensor<T>&,  \
                                                 const FluxWeights<W>&, const FluxSizes&,        \
                                                 const RopeTable&,                               \
                                                 const std::function<void(BasicTensor<T>&)>&,   \
                                                 FluxWeights<W>*);                               \
  template void flux_post_attention(FluxActivations<T>&, BasicTensor<T>, const FluxWeights<W>&, \
                                    bool, const std::function<void(BasicTensor<T>&)>&);         \
  template FluxActivations<T> flux_block_forward(const BasicTensor<T>&, const BasicTensor<T>&,  \
                                                 const FluxWeights<W>&, const FluxSizes&,        \
                                                 const RopeTable&, bool,                         \
                                                 const std::function<void(BasicTensor<T>&)>&,   \
                                                 std::size_t, const GatherTokens<T>&);          \
  template FluxActivations<T> flux_block_forward_lean(                                          \
      const BasicTensor<T>&, const BasicTensor<T>&, FluxWeights<W>&&,                           \
      const OutWeightRows<W>&, const FluxSizes&, const RopeTable&, bool,                        \
      const std::function<void(BasicTensor<T>&)>&, std::size_t, const GatherTokens<T>&);
DC_INSTANTIATE_FORWARD(float, float)
DC_INSTANTIATE_FORWARD(double, double)
DC_INSTANTIATE_FORWARD(double, float)
#undef DC_INSTANTIATE_FORWARD

}  // namespace dc::ref
