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

#include "harness/error.h"
#include "harness/scenario.h"
#include "reference/attention.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "reference/norms.h"
#include "reference/ops.h"
#include "reference/rope.h"

namespace dc {
namespace {

struct FluxSizes {
  std::size_t dim, heads, head_dim, mlp, txt, img_h, img_w;
  std::vector<int> rope_axes;
  std::size_t tokens() const { return txt + img_h * img_w; }
};

FluxSizes sizes_for(const std::string& name) {
  if (name == "flux1-dev") return {3072, 24, 128, 12288, 512, 64, 64, {16, 56, 56}};
  return {256, 16, 16, 1024, 32, 14, 16, {4, 6, 6}};  // FLUX scaled down; RoPE axes a guess
}

constexpr double kEps = 1e-6;

// Which proj_out columns a tp rank multiplies by.
ref::ColumnRanges proj_out_columns(const FluxSizes& z, std::size_t w, std::size_t i, bool contiguous) {
  if (contiguous) {
    const std::size_t width = (z.dim + z.mlp) / w;
    return {{i * width, (i + 1) * width}};
  }
  return {{i * z.dim / w, (i + 1) * z.dim / w},
          {z.dim + i * z.mlp / w, z.dim + (i + 1) * z.mlp / w}};
}

// The packed order tensor parallelism consumes: every rank's columns in turn.
ref::ColumnRanges packed_columns(const FluxSizes& z, std::size_t w) {
  ref::ColumnRanges all;
  for (std::size_t i = 0; i < w; ++i)
    for (auto r : proj_out_columns(z, w, i, false)) all.push_back(r);
  return all;
}

// The weights one tp rank holds (w ranks, index i); w = 1 gives the full block.
template <class T>
struct Weights {
  BasicTensor<T> ada_w, ada_b, q_w, q_b, k_w, k_b, v_w, v_b, mlp_w, mlp_b, gq, gk, out_w, out_b;
};

template <class T>
Weights<T> make_weights(std::uint64_t seed, const FluxSizes& z, std::size_t w, std::size_t i,
                        bool contiguous, DType dtype) {
  const std::size_t d = z.dim, m = z.mlp, D = z.head_dim;
  auto cvt = [&](Tensor t) {
    if constexpr (std::is_same_v<T, float>) round_to(dtype, t.data);
    return BasicTensor<T>(t.shape, std::vector<T>(t.data.begin(), t.data.end()));
  };
  auto full = [&](const char* name, Shape s, std::size_t fan_in) {
    return cvt(ref::generate(seed, name, s, 1.0f / std::sqrt(float(fan_in))));
  };
  // Column-parallel: rows [i*n/w, (i+1)*n/w) of an [n, fan_in] weight (and its bias).
  auto rows = [&](const char* name, std::size_t n, std::size_t fan_in) {
    ref::Ranges r{{i * n / w, (i + 1) * n / w}, {0, fan_in}};
    return cvt(ref::generate(seed, name, {n, fan_in}, 1.0f / std::sqrt(float(fan_in)), r));
  };
  auto bias_rows = [&](const char* name, std::size_t n, std::size_t fan_in) {
    ref::Ranges r{{i * n / w, (i + 1) * n / w}};
    return cvt(ref::generate(seed, name, {n}, 1.0f / std::sqrt(float(fan_in)), r));
  };
  // RMSNorm weights near 1.
  auto gain = [&](const char* name) {
    Tensor g = ref::generate(seed, name, {D}, 0.25f);
    for (auto& x : g.data) x += 1.0f;
    return cvt(g);
  };
  // Row-parallel proj_out: the rank's columns of [d, d+m], packed.
  Tensor out_full_cols;
  {
    Tensor parts;
    for (auto [a, b] : proj_out_columns(z, w, i, contiguous)) {
      ref::Ranges r{{0, d}, {a, b}};
      Tensor block = ref::generate(seed, "proj_out.w", {d, d + m}, 1.0f / std::sqrt(float(d + m)), r);
      parts = parts.size() ? ref::concat_last(parts, block) : block;
    }
    out_full_cols = parts;
  }
  return Weights<T>{full("adaln.w", {3 * d, d}, d), full("adaln.b", {3 * d}, d),
                    rows("q.w", d, d), bias_rows("q.b", d, d),
                    rows("k.w", d, d), bias_rows("k.b", d, d),
                    rows("v.w", d, d), bias_rows("v.b", d, d),
                    rows("mlp.w", m, d), bias_rows("mlp.b", m, d),
                    gain("norm_q.w"), gain("norm_k.w"),
                    cvt(out_full_cols), full("proj_out.b", {d}, d + m)};
}

// FLUX position ids: text tokens (0,0,0), image tokens (0, row, col).
ref::RopeTable flux_rope(const FluxSizes& z) {
  std::vector<std::vector<double>> pos(z.txt, std::vector<double>{0, 0, 0});
  for (std::size_t r = 0; r < z.img_h; ++r)
    for (std::size_t c = 0; c < z.img_w; ++c) pos.push_back({0, double(r), double(c)});
  return ref::rope_table(pos, z.rope_axes);
}

// Everything the block computes for one sample on one rank (or, with the full
// weights, for the reference), up to the partial proj_out product.
template <class T>
struct Activations {
  BasicTensor<T> ada, nx, q, k, v, attn, mlp, cat, partial;
};

template <class T, class Round>
Activations<T> block_forward(const BasicTensor<T>& h, const BasicTensor<T>& temb, const Weights<T>& w,
                             const FluxSizes& z, const ref::RopeTable& rope, bool add_bias,
                             Round round) {
  auto r = [&](BasicTensor<T> x) {
    round(x);
    return x;
  };
  const std::size_t n = z.tokens(), d = z.dim;
  Activations<T> a;
  a.ada = r(ref::linear(r(ref::silu(temb)), w.ada_w, w.ada_b));  // [1, 3d]: shift, scale, gate
  auto ln = r(ref::layer_norm(h, kEps));
  a.nx = BasicTensor<T>(ln.shape);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t j = 0; j < d; ++j)
      a.nx.data[t * d + j] = ln.data[t * d + j] * (T(1) + a.ada.data[d + j]) + a.ada.data[j];
  a.nx = r(a.nx);
  a.mlp = r(ref::gelu_tanh(r(ref::linear(a.nx, w.mlp_w, w.mlp_b))));
  const std::size_t heads = w.q_w.shape[0] / z.head_dim;
  auto project = [&](const BasicTensor<T>& wt, const BasicTensor<T>& b) {
    return ref::reshape(r(ref::linear(a.nx, wt, b)), {n, heads, z.head_dim});
  };
  a.q = r(ref::apply_rope(r(ref::rms_norm(project(w.q_w, w.q_b), w.gq, kEps)), rope));
  a.k = r(ref::apply_rope(r(ref::rms_norm(project(w.k_w, w.k_b), w.gk, kEps)), rope));
  a.v = project(w.v_w, w.v_b);
  a.attn = ref::reshape(r(ref::attention(a.q, a.k, a.v, 1.0 / std::sqrt(double(z.head_dim)))),
                        {n, heads * z.head_dim});
  a.cat = ref::concat_last(a.attn, a.mlp);
  a.partial = r(ref::linear(a.cat, w.out_w, add_bias ? w.out_b : BasicTensor<T>()));
  return a;
}

// out = gate * y + h
template <class T>
BasicTensor<T> gated_residual(const BasicTensor<T>& y, const BasicTensor<T>& ada, const BasicTensor<T>& h,
                              std::size_t d) {
  BasicTensor<T> out(h.shape);
  for (std::size_t i = 0; i < h.size(); ++i) out.data[i] = ada.data[2 * d + i % d] * y.data[i] + h.data[i];
  return out;
}

template <class T>
BasicTensor<T> batched(BasicTensor<T> x) {  // add a leading batch dimension of 1
  x.shape.insert(x.shape.begin(), 1);
  return x;
}

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
    return {{"proj_out_contiguous",
             "row-parallel proj_out takes contiguous weight columns (seeds/002 TP-1): noise"},
            {"proj_out_bias_every_rank", "every tp rank adds the proj_out bias: y gets W x bias"}};
  }
  std::string default_mesh(int world) const override {
    int tp = world % 4 == 0 ? 4 : world % 2 == 0 ? 2 : 1;
    return fmt::format("dp={},tp={}", world / tp, tp);
  }
  void check_mesh(const Mesh& mesh, const std::string& size) const override {
    if (mesh.axes().size() != 2 || mesh.axis_index("dp") < 0 || mesh.axis_index("tp") < 0)
      input_error("flux_tp needs a mesh with exactly the axes dp and tp, got {}", mesh.str());
    const auto z = sizes_for(size);
    const int tp = mesh.axis_size("tp");
    if (z.heads % tp != 0)
      input_error("flux_tp ({}): tp={} must divide the {} heads", size, tp, z.heads);
  }

  void run(RunContext& ctx) const override {
    const auto z = sizes_for(ctx.size);
    const std::size_t tp = ctx.mesh.axis_size("tp"), dp = ctx.mesh.axis_size("dp");
    const auto coords = ctx.mesh.coords(ctx.world.rank());
    const std::size_t b = coords[ctx.mesh.axis_index("dp")], i = coords[ctx.mesh.axis_index("tp")];
    const Comm tp_comm = ctx.world.split(ctx.mesh, {"tp"});
    const auto rope = flux_rope(z);
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
    const auto w = make_weights<float>(ctx.seed, z, tp, i, contiguous, ctx.dtype);
    auto round = [&](Tensor& t) { round_to(ctx.dtype, t.data); };
    // The bias once: on tp rank 0, before the all-reduce (vLLM's RowParallelLinear rule).
    auto a = block_forward(h, temb, w, z, rope, bias_every_rank || i == 0, round);

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
    Tensor out = gated_residual(y, a.ada, h, d);
    round(out);
    const Layout by_sample = Layout::parse("dp", "");
    ctx.taps.tap("y", batched(y), {.layout = by_sample, .reduction_depth = long(d + z.mlp)});
    ctx.taps.tap("out", batched(out), {.layout = by_sample, .reduction_depth = long(d + z.mlp)});

    if (ctx.taps.is_reference_rank()) record_reference(ctx, z, tp, dp, rope);
  }

 private:
  template <class T>
  static void record(RunContext& ctx, const FluxSizes& z, const Activations<T>& a, const BasicTensor<T>& h,
                     const BasicTensor<T>& temb, const BasicTensor<T>& out_w) {
    const long d = long(z.dim), m = long(z.mlp), n = long(z.tokens());
    const Layout sample = Layout::parse("dp", ""), heads = Layout::parse("dp,-,tp,-", ""),
                 cols = Layout::parse("dp,-,tp", "");
    ctx.taps.tap("input/hidden", batched(h), {.layout = sample});
    ctx.taps.tap("input/temb", batched(temb), {.layout = sample});
    ctx.taps.tap("adaln", batched(a.ada), {.layout = sample, .reduction_depth = d});
    ctx.taps.tap("nx", batched(a.nx), {.layout = sample, .reduction_depth = d});
    ctx.taps.tap("attn/q", batched(a.q), {.layout = heads, .reduction_depth = d});
    ctx.taps.tap("attn/k", batched(a.k), {.layout = heads, .reduction_depth = d});
    ctx.taps.tap("attn/v", batched(a.v), {.layout = heads, .reduction_depth = d});
    ctx.taps.tap("attn/out", batched(a.attn), {.layout = cols, .reduction_depth = n});
    ctx.taps.tap("mlp", batched(a.mlp), {.layout = cols, .reduction_depth = d});
    ctx.taps.tap("proj_out/input_packed", batched(a.cat), {.layout = cols, .reduction_depth = d});
    // The weight block must be exactly the reference's packed columns.
    ctx.taps.tap("proj_out/weight", out_w, {.layout = Layout::parse("-,tp", ""), .atol = 0.0, .rtol = 0.0});
    ctx.taps.tap("proj_out/partial", batched(a.partial),
                 {.layout = Layout::parse("dp", "tp"), .reduction_depth = d + m});
  }

  // The single-rank reference in float64: every sample with the full weights.
  void record_reference(RunContext& ctx, const FluxSizes& z, std::size_t tp, std::size_t dp,
                        const ref::RopeTable& rope) const {
    const std::size_t n = z.tokens(), d = z.dim;
    const auto w = make_weights<double>(ctx.seed, z, 1, 0, false, ctx.dtype);
    auto exact = [](RefTensor&) {};
    const RefTensor h_all = ref::to_ref(ref::generate(ctx.seed, "hidden", {dp, n, d}, 1.0f));
    const RefTensor temb_all = ref::to_ref(ref::generate(ctx.seed, "temb", {dp, 1, d}, 1.0f));
    std::map<std::string, std::vector<RefTensor>> per_sample;
    const auto packed = packed_columns(z, tp);
    for (std::size_t b = 0; b < dp; ++b) {
      auto h = ref::reshape(ref::batch_item(h_all, b), {n, d});
      auto temb = ref::reshape(ref::batch_item(temb_all, b), {1, d});
      auto a = block_forward(h, temb, w, z, rope, true, exact);
      auto& s = per_sample;
      s["input/hidden"].push_back(h);
      s["input/temb"].push_back(temb);
      s["adaln"].push_back(a.ada);
      s["nx"].push_back(a.nx);
      s["attn/q"].push_back(a.q);
      s["attn/k"].push_back(a.k);
      s["attn/v"].push_back(a.v);
      s["attn/out"].push_back(a.attn);
      s["mlp"].push_back(a.mlp);
      s["proj_out/input_packed"].push_back(ref::take_last(a.cat, packed));
      s["proj_out/partial"].push_back(a.partial);
      s["y"].push_back(a.partial);
      s["out"].push_back(gated_residual(a.partial, a.ada, h, d));
    }
    for (auto& [name, xs] : per_sample) ctx.taps.reference(name, ref::stack(xs));
    // What the sharded run should hold: the dtype-rounded weight, packed.
    auto w_run = make_weights<float>(ctx.seed, z, 1, 0, false, ctx.dtype);
    ctx.taps.reference("proj_out/weight", ref::to_ref(ref::take_last(w_run.out_w, packed)));
  }
};

}  // namespace

DIFFCHECK_REGISTER_SCENARIO(FluxTp)

}  // namespace dc
