// usp_attention: unified sequence parallelism (xDiT / yunchang's USP) on a
// Wan 2.x DiT block: tokens split over ring x sp (rank (r, s) holds token
// block r*sp + s); Ulysses all-to-all over `sp` (heads scattered, the ring
// block's tokens gathered), then ring attention over `ring` with log-sum-exp
// merges (scenarios/ring_attention.h), then the reverse all-to-all. The block
// around attention (modulation, q/k RMSNorm, 3-axis RoPE with global
// positions, cross-attention, FFN) is dit_ulysses's.
//
// Faults model the LSE bugs of real ring attention: a kernel that returns its
// LSE in another layout (seeds/002 TP-3; diffusers, yunchang), one whose LSE
// misses its smoothing term (aiter on Wan2.2 via xDiT), and a K/V block
// received into the buffer still being read. docs/usp_attention.md has the
// math, shapes and taps.
#include <fmt/format.h>

#include <cmath>

#include "harness/check/tolerance.h"
#include "harness/core/error.h"
#include "harness/run/scenario.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "reference/ops.h"
#include "reference/wan_block.h"
#include "scenarios/ring_attention.h"
#include "scenarios/ulysses_attention.h"

namespace dc {
namespace {

using ref::WanSizes;

// "default": dit_ulysses's Wan block (256 tokens, 16 heads of 16).
// "lse_square": 16 tokens, so that on meshes with ring == sp (and one head
// chunk) a rank's query block is as long as it has heads: there the LSE
// layout fault is silent instead of a crash.
WanSizes usp_sizes(const std::string& size) {
  WanSizes z;
  if (size == "lse_square") z.frames = 1, z.height = 4, z.width = 4;
  return z;
}

class UspAttention final : public Scenario {
 public:
  std::string name() const override { return "usp_attention"; }
  std::string summary() const override {
    return "Wan 2.x DiT block with unified sequence parallelism: Ulysses all-to-alls over 'sp', ring attention "
           "with log-sum-exp merges over 'ring'; one sample per 'dp' group";
  }
  std::vector<std::string> sizes() const override { return {"default", "lse_square"}; }
  std::vector<std::string> mesh_axes() const override { return {"dp", "ring", "sp"}; }
  std::vector<FlagSpec> flags() const override {
    return {{"ring_overlap", FlagType::boolean, "false",
             "post the next K/V transfer before computing the current block (double buffers)"},
            {"kv_transfer", FlagType::string, "p2p",
             "how K/V blocks travel: p2p (one ring step at a time) or allgather (all blocks at once)",
             {"p2p", "allgather"}},
            {"ulysses_chunks", FlagType::integer, "1",
             "split the all-to-alls into head chunks (MaxDiffusion's rule)", {"1", "2"}},
            {"async_a2a", FlagType::boolean, "false", "non-blocking Ulysses all-to-alls, waited before use"},
            {"merge", FlagType::string, "sigmoid",
             "LSE merge form: sigmoid (out -= sigmoid(lse_b - lse)(out - out_b)) or maxexp (max-subtracted "
             "exponentials)",
             {"sigmoid", "maxexp"}}};
  }
  std::vector<FaultSpec> faults() const override {
    return {{"lse_layout",
             "the attention kernel returns its LSE as [heads, S] where the merge reads [S, heads]: a crash on "
             "the first ring step, or silently wrong where a rank's query block is as long as it has heads "
             "(--size lse_square, ring == sp)",
             "ring/chunk0/step0/lse", {}, {}, {}, "a rank's query block is not as long as it has heads",
             [](const Mesh& m, const std::string& size) {
               const WanSizes z = usp_sizes(size);
               return z.heads / std::size_t(m.axis_size("sp")) != z.tokens() / std::size_t(m.axis_size("ring"));
             }},
            {"lse_offset",
             "the kernel smooths K by its block mean (softmax unchanged) and leaves its LSE low by "
             "q.mean(k_block): each block's output is right, ring merges are wrong (error grows with ring; "
             "at ring = 1 only the LSE shows it)",
             "ring/chunk0/step0/lse", {}, {}, {}, {}, {}, false, "the LSE is left low by A x q.mean(k_block)"},
            {"ring_kv_reuse",
             "with ring_overlap, the next K/V block is received into the buffer still being read: finite, "
             "wrong",
             "ring/chunk0/step0/out", {"ring_overlap=true"}, "ring > 1",
             [](const Mesh& m) { return m.axis_size("ring") > 1; }, {}, {}, false, {}, "ring/chunk0/out"}};
  }
  std::string default_mesh(int world) const override {
    int sp = 1, ring = 1, rest = world;
    for (int* axis : {&sp, &ring, &sp, &ring})
      if (rest % 2 == 0) *axis *= 2, rest /= 2;
    return fmt::format("dp={},ring={},sp={}", rest, ring, sp);
  }
  void check_mesh(const Mesh& mesh, const std::string& size) const override {
    if (mesh.axes().size() != 3 || mesh.axis_index("dp") != 0 || mesh.axis_index("ring") != 1 ||
        mesh.axis_index("sp") != 2)
      input_error("usp_attention needs a mesh with exactly the axes dp, ring, sp (in that order), got {}", mesh.str());
    const WanSizes z = usp_sizes(size);
    const auto sp = static_cast<std::size_t>(mesh.axis_size("sp")), ring = static_cast<std::size_t>(mesh.axis_size("ring"));
    if (z.heads % sp) input_error("usp_attention: sp={} must divide the {} heads", sp, z.heads);
    if (z.tokens() % (ring * sp))
      input_error("usp_attention ({}): ring x sp = {} must divide the {} tokens", size, ring * sp, z.tokens());
  }

  // The ring's options from the flags, with its injected faults.
  static RingOptions ring_options(const RunContext& ctx) {
    RingOptions ro;
    ro.overlap = ctx.flags.get_bool("ring_overlap");
    const std::string transfer = ctx.flags.get_string("kv_transfer"), merge = ctx.flags.get_string("merge");
    if (transfer != "p2p" && transfer != "allgather")
      input_error("kv_transfer must be p2p or allgather (got '{}')", transfer);
    if (merge != "sigmoid" && merge != "maxexp") input_error("merge must be sigmoid or maxexp (got '{}')", merge);
    ro.allgather = transfer == "allgather";
    ro.sigmoid_merge = merge == "sigmoid";
    ro.dtype = ctx.dtype;
    ro.fault_lse_layout = ctx.injected("lse_layout");
    ro.fault_lse_offset = ctx.injected("lse_offset");
    ro.fault_lse_scale = ctx.fault_scale;
    ro.fault_kv_reuse = ctx.injected("ring_kv_reuse");
    return ro;
  }

  // Attention outputs are convex combinations of v: their atol is the
  // dtype-derived tolerance on the global RMS of v (as in dit_ulysses). An
  // LSE is a smooth maximum of logits q.k: its error is that of a logit,
  // a D-term product of vectors of RMS 1 (q, k normed; k scaled by D^-1/2).
  static std::pair<double, double> attention_atols(const RunContext& ctx, const Tensor& v, const WanSizes& z) {
    std::vector<double> sums{0.0, double(v.size())};
    for (float t : v.data) sums[0] += double(t) * t;
    ctx.world.all_reduce_sum(std::span<double>(sums));
    const double rms_v = std::sqrt(sums[0] / sums[1]);
    const double attn_atol = derive_tolerance({dtype_name(ctx.dtype), long(z.tokens()), {}, {}, {}, {}, rms_v}).atol;
    const double lse_atol =
        derive_tolerance({dtype_name(ctx.dtype), long(z.head_dim), {}, {}, {}, {}, std::sqrt(double(z.head_dim))}).atol;
    return {attn_atol, lse_atol};
  }

  void run(RunContext& ctx) const override {
    const WanSizes z = usp_sizes(ctx.size);
    const std::size_t sp = ctx.mesh.axis_size("sp"), ring = ctx.mesh.axis_size("ring"), dp = ctx.mesh.axis_size("dp");
    const auto coords = ctx.mesh.coords(ctx.world.rank());
    const std::size_t b = coords[0], r = coords[1], s = coords[2];
    const std::size_t s_all = z.tokens(), sl = s_all / (ring * sp), first = (r * sp + s) * sl, d = z.dim;

    UlyssesOptions opt;
    opt.chunks = static_cast<std::size_t>(std::max(0L, ctx.flags.get_int("ulysses_chunks")));
    opt.async = ctx.flags.get_bool("async_a2a");
    opt.dtype = ctx.dtype;
    const auto chunks = ulysses_head_chunks(z.heads, sp, opt.chunks);  // validates before any collective
    const RingOptions ro = ring_options(ctx);

    const Comm sp_comm = ctx.world.split(ctx.mesh, {"sp"});
    const Comm ring_comm = ctx.world.split(ctx.mesh, {"ring"});
    auto sample = [&](const char* name, std::size_t rows, std::size_t r0, std::size_t r1, float scale) {
      Tensor t = ref::generate(ctx.seed, name, {dp, rows, d}, scale, {{b, b + 1}, {r0, r1}, {0, d}});
      round_to(ctx.dtype, t.data);
      return ref::reshape(t, {r1 - r0, d});
    };
    const Tensor x = sample("x", s_all, first, first + sl, 1.0f);
    const Tensor e = sample("e", 6, 0, 6, 0.1f);
    const Tensor enc = sample("enc", z.enc_len, 0, z.enc_len, 1.0f);
    const auto w = ref::make_wan_weights<float>(ctx.seed, z, ctx.dtype);
    std::vector<std::size_t> positions;
    for (std::size_t i = 0; i < sl; ++i) positions.push_back(first + i);
    const ref::RoundFn<float> round = [&](Tensor& t) { round_to(ctx.dtype, t.data); };

    const Layout sample_l = Layout::parse("dp", ""), tokens_l = Layout::parse("dp,ring*sp", "");
    const Layout heads_l = Layout::parse("dp,sp,ring", "");
    const long dl = long(d), sdepth = long(s_all);
    auto pre = ref::wan_pre_attention(x, e, w, z, ref::wan_rope(z, positions), round);
    ctx.taps.tap("mod", ref::with_batch_dim(pre.mod), {.layout = sample_l});
    ctx.taps.tap("n1", ref::with_batch_dim(pre.n1), {.layout = tokens_l, .reduction_depth = dl});
    ctx.taps.tap("attn/q", ref::with_batch_dim(pre.q), {.layout = tokens_l, .reduction_depth = dl});
    ctx.taps.tap("attn/k", ref::with_batch_dim(pre.k), {.layout = tokens_l, .reduction_depth = dl});
    ctx.taps.tap("attn/v", ref::with_batch_dim(pre.v), {.layout = tokens_l, .reduction_depth = dl});

    // Not a structured binding: clang 14 (the sanitized tree's compiler) cannot capture one.
    const std::pair<double, double> atols = attention_atols(ctx, pre.v, z);
    const double attn_atol = atols.first, lse_atol = atols.second;

    opt.attend = [&](std::size_t c, const Tensor& q, const Tensor& k, const Tensor& v) {
      const std::string p = fmt::format("ring/chunk{}/", c);
      ctx.taps.tap(p + "q_after_a2a", ref::with_batch_dim(q), {.layout = heads_l, .reduction_depth = dl});
      ctx.taps.tap(p + "k_after_a2a", ref::with_batch_dim(k), {.layout = heads_l, .reduction_depth = dl});
      ctx.taps.tap(p + "v_after_a2a", ref::with_batch_dim(v), {.layout = heads_l, .reduction_depth = dl});
      const RingObserver observe = [&](std::size_t t, const Tensor& out, const Tensor& lse) {
        const std::string at = fmt::format("{}step{}/", p, t);
        // A step attends to one block of keys: per mesh (another block on one device).
        ctx.taps.tap(at + "out", ref::with_batch_dim(out),
                     {.layout = heads_l, .reduction_depth = sdepth, .atol = attn_atol, .per_mesh = true});
        ctx.taps.tap(at + "lse", ref::with_batch_dim(lse),
                     {.layout = heads_l, .atol = lse_atol, .rtol = 0.0, .per_mesh = true});
      };
      auto [out, lse] = ring_attention(ring_comm, q, k, v, ro, observe);
      ctx.taps.tap(p + "out", ref::with_batch_dim(out), {.layout = heads_l, .reduction_depth = sdepth, .atol = attn_atol});
      ctx.taps.tap(p + "lse", ref::with_batch_dim(lse), {.layout = heads_l, .atol = lse_atol, .rtol = 0.0});
      return out;
    };
    Tensor attn = ulysses_attention(sp_comm, pre.q, pre.k, pre.v, opt, {});
    attn = ref::reshape(attn, {sl, d});
    ctx.taps.tap("attn/out", ref::with_batch_dim(attn), {.layout = tokens_l, .reduction_depth = sdepth, .atol = attn_atol});
    auto post = ref::wan_post_attention(x, attn, pre.mod, enc, w, z, round);
    ctx.taps.tap("x1", ref::with_batch_dim(post.x1), {.layout = tokens_l, .reduction_depth = dl});
    ctx.taps.tap("x2", ref::with_batch_dim(post.x2), {.layout = tokens_l, .reduction_depth = dl});
    ctx.taps.tap("ffn/hidden", ref::with_batch_dim(post.hidden), {.layout = tokens_l, .reduction_depth = dl});
    ctx.taps.tap("out", ref::with_batch_dim(post.out), {.layout = tokens_l, .reduction_depth = long(z.ffn)});

    record_reference(ctx, z, dp, ring, chunks);
  }

 private:
  // Every sample in float64, samples spread over the ranks. Each ring step's
  // reference is exact attention of every query block over the key blocks
  // its ring rank has seen by then: blocks r, r-1, ..., r-t (mod ring).
  void record_reference(RunContext& ctx, const WanSizes& z, std::size_t dp, std::size_t ring,
                        const std::vector<HeadChunk>& chunks) const {
    if (ctx.taps.references_cached()) return;  // read from the reference cache
    const ReferenceClock clock(ctx.taps);
    const auto samples = ctx.taps.my_reference_rows(dp);
    if (samples.empty()) return;
    const std::size_t s_all = z.tokens(), d = z.dim, sr = s_all / ring, hd = z.head_dim;
    const auto w = ref::make_wan_weights<double>(ctx.seed, z, ctx.dtype);
    const ref::RoundFn<double> exact = [](RefTensor&) {};
    std::vector<std::size_t> positions(s_all);
    for (std::size_t i = 0; i < s_all; ++i) positions[i] = i;
    const auto rope = ref::wan_rope(z, positions);
    for (std::size_t b : samples) {
      auto input = [&](const char* name, std::size_t rows, float scale) {
        return ref::reshape(ref::to_ref(ref::generate(ctx.seed, name, {dp, rows, d}, scale, {{b, b + 1}, {0, rows}, {0, d}})),
                            {rows, d});
      };
      auto x = input("x", s_all, 1.0f), e = input("e", 6, 0.1f), enc = input("enc", z.enc_len, 1.0f);
      auto pre = ref::wan_pre_attention(x, e, w, z, rope, exact);
      auto put = [&](const std::string& name, const RefTensor& t) { ctx.taps.reference_row(name, dp, b, t); };
      put("mod", pre.mod);
      put("n1", pre.n1);
      put("attn/q", pre.q);
      put("attn/k", pre.k);
      put("attn/v", pre.v);
      RefTensor attn_all({s_all, z.heads, hd});
      for (std::size_t c = 0; c < chunks.size(); ++c) {
        const std::string p = fmt::format("ring/chunk{}/", c);
        const auto q = ref::heads_major(pre.q, chunks[c].begin, chunks[c].end);
        const auto k = ref::heads_major(pre.k, chunks[c].begin, chunks[c].end);
        const auto v = ref::heads_major(pre.v, chunks[c].begin, chunks[c].end);
        put(p + "q_after_a2a", q);
        put(p + "k_after_a2a", k);
        put(p + "v_after_a2a", v);
        const std::size_t hc = q.shape[0];
        RefTensor out({hc, s_all, hd}), lse({hc, s_all});
        for (std::size_t t = 0; t < ring; ++t) {
          for (std::size_t r = 0; r < ring; ++r) {
            // Query block r against the key blocks seen after step t.
            RefTensor ks({hc, (t + 1) * sr, hd}), vs({hc, (t + 1) * sr, hd});
            for (std::size_t j = 0; j <= t; ++j) {
              const std::size_t blk = (r + ring - j) % ring;
              const auto kb = ref::token_rows(k, blk * sr, (blk + 1) * sr), vb = ref::token_rows(v, blk * sr, (blk + 1) * sr);
              for (std::size_t a = 0; a < hc; ++a) {
                std::copy(kb.ptr() + a * sr * hd, kb.ptr() + (a + 1) * sr * hd, ks.ptr() + (a * (t + 1) + j) * sr * hd);
                std::copy(vb.ptr() + a * sr * hd, vb.ptr() + (a + 1) * sr * hd, vs.ptr() + (a * (t + 1) + j) * sr * hd);
              }
            }
            auto [o, l] = block_attention(ref::token_rows(q, r * sr, (r + 1) * sr), ks, vs);
            for (std::size_t a = 0; a < hc; ++a) {
              std::copy(o.ptr() + a * sr * hd, o.ptr() + (a + 1) * sr * hd, out.ptr() + (a * s_all + r * sr) * hd);
              std::copy(l.ptr() + a * sr, l.ptr() + (a + 1) * sr, lse.ptr() + a * s_all + r * sr);
            }
          }
          put(fmt::format("{}step{}/out", p, t), out);
          put(fmt::format("{}step{}/lse", p, t), lse);
        }
        put(p + "out", out);
        put(p + "lse", lse);
        for (std::size_t a = 0; a < hc; ++a)
          for (std::size_t i = 0; i < s_all; ++i)
            std::copy(out.ptr() + (a * s_all + i) * hd, out.ptr() + (a * s_all + i + 1) * hd,
                      attn_all.ptr() + (i * z.heads + chunks[c].begin + a) * hd);
      }
      const auto attn = ref::reshape(attn_all, {s_all, d});
      auto post = ref::wan_post_attention(x, attn, pre.mod, enc, w, z, exact);
      put("attn/out", attn);
      put("x1", post.x1);
      put("x2", post.x2);
      put("ffn/hidden", post.hidden);
      put("out", post.out);
    }
  }
};

}  // namespace

DIFFCHECK_REGISTER_SCENARIO(UspAttention)

}  // namespace dc
