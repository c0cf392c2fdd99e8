// dit_ulysses: a Wan 2.x DiT block with Ulysses sequence parallelism over `sp`
// (seeds/000, seeds/004). Each sp rank owns S/P tokens; self-attention goes
// through the head-chunked Ulysses all-to-alls and flash attention; everything
// else (modulation, norms, projections, cross-attention, FFN) is token-local.
// RoPE uses GLOBAL token positions. One sample per dp group.
//
// Faults:
//   a2a_read_before_wait   the #429 miscompile: with async_a2a AND overlap,
//                          compute reads all-to-all #1's buffer before its wait
//                          (NaN-poisoned when posted) -> deterministic NaN
//   a2a_send_reuse         with async_a2a AND overlap, chunk c+1 is packed into
//                          the send buffer chunk c is sending -> wrong heads
//   rope_local_positions   RoPE with each rank's local token positions
#include <fmt/format.h>

#include <cmath>
#include <map>

#include "harness/core/error.h"
#include "harness/run/scenario.h"
#include "harness/check/tolerance.h"
#include "reference/attention.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "reference/ops.h"
#include "reference/wan_block.h"
#include "scenarios/ulysses_attention.h"

namespace dc {
namespace {

using ref::WanSizes;

class DitUlysses final : public Scenario {
 public:
  std::string name() const override { return "dit_ulysses"; }
  std::string summary() const override {
    return "Wan 2.x DiT block, Ulysses sequence parallelism over 'sp' with head-chunked "
           "all-to-alls and flash attention; one sample per 'dp' group";
  }
  std::vector<FlagSpec> flags() const override {
    return {{"ulysses_chunks", FlagType::integer, "1",
             "split the all-to-alls into head chunks (MaxDiffusion ULYSSES_ATTENTION_CHUNKS; the "
             "last chunk takes the remainder)",
             {"1", "2", "3"}},
            {"async_a2a", FlagType::boolean, "false", "non-blocking all-to-alls, waited before use"},
            {"overlap", FlagType::boolean, "false",
             "pipeline: post chunk c+1's all-to-all, then compute chunk c (double buffers)"},
            {"fuse_qkv_a2a", FlagType::boolean, "false", "one all-to-all for q, k and v together"},
            {"flash_block", FlagType::integer, "64", "query and key block size of flash attention",
             {"64", "7"}}};
  }
  std::vector<FaultSpec> faults() const override {
    // The nightly matrix found the first two documented as "sp > 1" wrongly:
    // an all-to-all over one rank still goes through the schedule (both fire
    // at sp = 1), and with 16 heads over sp = 16 there is one head per rank,
    // so a single head chunk and nothing to overwrite.
    const auto sharded = [](const Mesh& m) { return m.axis_size("sp") > 1; };
    const auto two_chunks = [](const Mesh& m) { return WanSizes{}.heads / std::size_t(m.axis_size("sp")) >= 2; };
    return {{"a2a_read_before_wait",
             "with async_a2a and overlap both on, attention reads all-to-all #1's receive buffer "
             "before its wait (NaN-poisoned): the seeds/000 NaN",
             "ulysses/chunk0/q_after_a2a", {"async_a2a=true", "overlap=true"}},
            {"a2a_send_reuse",
             "with async_a2a and overlap both on, the next chunk is packed into the send buffer "
             "still being sent: finite, wrong heads (needs ulysses_chunks >= 2)",
             "ulysses/chunk0/q_after_a2a", {"async_a2a=true", "overlap=true", "ulysses_chunks=2"},
             "there are two head chunks (at least 2 heads per sp rank)", two_chunks},
            {"rope_local_positions", "RoPE with local instead of global token positions", "attn/q", {}, "sp > 1",
             sharded}};
  }
  std::string default_mesh(int world) const override {
    auto [dp, sp] = default_two_axis_split(world);
    return fmt::format("dp={},sp={}", dp, sp);
  }
  void check_mesh(const Mesh& mesh, const std::string&) const override {
    if (mesh.axes().size() != 2 || mesh.axis_index("dp") < 0 || mesh.axis_index("sp") < 0)
      input_error("dit_ulysses needs a mesh with exactly the axes dp and sp, got {}", mesh.str());
    const WanSizes z;
    const auto sp = static_cast<std::size_t>(mesh.axis_size("sp"));
    if (z.heads % sp) input_error("dit_ulysses: sp={} must divide the {} heads", sp, z.heads);
    if (z.tokens() % sp) input_error("dit_ulysses: sp={} must divide the {} tokens", sp, z.tokens());
  }

  void run(RunContext& ctx) const override {
    const WanSizes z;
    const std::size_t sp = ctx.mesh.axis_size("sp"), dp = ctx.mesh.axis_size("dp");
    const auto coords = ctx.mesh.coords(ctx.world.rank());
    const std::size_t b = coords[ctx.mesh.axis_index("dp")], c = coords[ctx.mesh.axis_index("sp")];
    const std::size_t s_all = z.tokens(), sl = s_all / sp, d = z.dim;

    UlyssesOptions opt;
    opt.chunks = static_cast<std::size_t>(std::max(0L, ctx.flags.get_int("ulysses_chunks")));
    opt.async = ctx.flags.get_bool("async_a2a");
    opt.overlap = ctx.flags.get_bool("overlap");
    opt.fused = ctx.flags.get_bool("fuse_qkv_a2a");
    const long fb = ctx.flags.get_int("flash_block");
    if (fb < 1) input_error("flash_block must be >= 1 (got {})", fb);
    opt.flash_block = static_cast<std::size_t>(fb);
    opt.dtype = ctx.dtype;
    opt.fault_read_before_wait = ctx.injected("a2a_read_before_wait");
    opt.fault_send_reuse = ctx.injected("a2a_send_reuse");
    const auto chunks = ulysses_head_chunks(z.heads, sp, opt.chunks);  // validates before any collective

    const Comm sp_comm = ctx.world.split(ctx.mesh, {"sp"});
    auto sample = [&](const char* name, std::size_t rows, std::size_t r0, std::size_t r1, float scale) {
      Tensor t = ref::generate(ctx.seed, name, {dp, rows, d}, scale, {{b, b + 1}, {r0, r1}, {0, d}});
      round_to(ctx.dtype, t.data);
      return ref::reshape(t, {r1 - r0, d});
    };
    const Tensor x = sample("x", s_all, c * sl, (c + 1) * sl, 1.0f);
    const Tensor e = sample("e", 6, 0, 6, 0.1f);
    const Tensor enc = sample("enc", z.enc_len, 0, z.enc_len, 1.0f);
    const auto w = ref::make_wan_weights<float>(ctx.seed, z, ctx.dtype);
    std::vector<std::size_t> positions;
    for (std::size_t i = 0; i < sl; ++i)
      positions.push_back(ctx.injected("rope_local_positions") ? i : c * sl + i);
    const ref::RoundFn<float> round = [&](Tensor& t) { round_to(ctx.dtype, t.data); };

    const Layout sample_l = Layout::parse("dp", ""), tokens_l = Layout::parse("dp,sp", "");
    const long dl = long(d), sdepth = long(s_all);
    auto pre = ref::wan_pre_attention(x, e, w, z, ref::wan_rope(z, positions), round);
    ctx.taps.tap("mod", ref::with_batch_dim(pre.mod), {.layout = sample_l});
    ctx.taps.tap("n1", ref::with_batch_dim(pre.n1), {.layout = tokens_l, .reduction_depth = dl});
    ctx.taps.tap("attn/q", ref::with_batch_dim(pre.q), {.layout = tokens_l, .reduction_depth = dl});
    ctx.taps.tap("attn/k", ref::with_batch_dim(pre.k), {.layout = tokens_l, .reduction_depth = dl});
    ctx.taps.tap("attn/v", ref::with_batch_dim(pre.v), {.layout = tokens_l, .reduction_depth = dl});

    // Attention outputs are convex combinations of v: their rounding error
    // scales with |v|, not with the (smaller, cancelling) output. Their atol is
    // therefore the dtype-derived tolerance on the global RMS of v.
    std::vector<double> sums{0.0, double(pre.v.size())};
    for (float t : pre.v.data) sums[0] += double(t) * t;
    ctx.world.all_reduce_sum(std::span<double>(sums));
    const double rms_v = std::sqrt(sums[0] / sums[1]);
    const double attn_atol =
        derive_tolerance({dtype_name(ctx.dtype), sdepth, {}, {}, {}, {}, rms_v}).atol;

    const Layout heads_l = Layout::parse("dp,sp", "");
    ChunkObserver observe = [&](std::size_t i, const HeadChunk&, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& attn) {
      const std::string p = fmt::format("ulysses/chunk{}/", i);
      ctx.taps.tap(p + "q_after_a2a", ref::with_batch_dim(q), {.layout = heads_l, .reduction_depth = dl});
      ctx.taps.tap(p + "k_after_a2a", ref::with_batch_dim(k), {.layout = heads_l, .reduction_depth = dl});
      ctx.taps.tap(p + "v_after_a2a", ref::with_batch_dim(v), {.layout = heads_l, .reduction_depth = dl});
      ctx.taps.tap(p + "attn", ref::with_batch_dim(attn), {.layout = heads_l, .reduction_depth = sdepth, .atol = attn_atol});
    };
    Tensor attn = ulysses_attention(sp_comm, pre.q, pre.k, pre.v, opt, observe);
    attn = ref::reshape(attn, {sl, d});
    ctx.taps.tap("attn/out", ref::with_batch_dim(attn), {.layout = tokens_l, .reduction_depth = sdepth, .atol = attn_atol});
    auto post = ref::wan_post_attention(x, attn, pre.mod, enc, w, z, round);
    ctx.taps.tap("x1", ref::with_batch_dim(post.x1), {.layout = tokens_l, .reduction_depth = dl});
    ctx.taps.tap("x2", ref::with_batch_dim(post.x2), {.layout = tokens_l, .reduction_depth = dl});
    ctx.taps.tap("ffn/hidden", ref::with_batch_dim(post.hidden), {.layout = tokens_l, .reduction_depth = dl});
    ctx.taps.tap("out", ref::with_batch_dim(post.out), {.layout = tokens_l, .reduction_depth = long(z.ffn)});

    record_reference(ctx, z, dp, chunks);
  }

 private:
  // Every sample in float64 with exact softmax; the samples are spread over
  // the ranks (TapRecorder's rule).
  void record_reference(RunContext& ctx, const WanSizes& z, std::size_t dp,
                        const std::vector<HeadChunk>& chunks) const {
    if (ctx.taps.references_cached()) return;  // read from the reference cache
    const ReferenceClock clock(ctx.taps);
    const auto samples = ctx.taps.my_reference_rows(dp);
    if (samples.empty()) return;
    const std::size_t s_all = z.tokens(), d = z.dim;
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
      auto attn = ref::attention(pre.q, pre.k, pre.v, 1.0);  // k is pre-scaled
      auto post = ref::wan_post_attention(x, ref::reshape(attn, {s_all, d}), pre.mod, enc, w, z, exact);
      auto put = [&](const std::string& name, const RefTensor& t) { ctx.taps.reference_row(name, dp, b, t); };
      put("mod", pre.mod);
      put("n1", pre.n1);
      put("attn/q", pre.q);
      put("attn/k", pre.k);
      put("attn/v", pre.v);
      for (std::size_t i = 0; i < chunks.size(); ++i) {
        const std::string p = fmt::format("ulysses/chunk{}/", i);
        put(p + "q_after_a2a", ref::heads_major(pre.q, chunks[i].begin, chunks[i].end));
        put(p + "k_after_a2a", ref::heads_major(pre.k, chunks[i].begin, chunks[i].end));
        put(p + "v_after_a2a", ref::heads_major(pre.v, chunks[i].begin, chunks[i].end));
        put(p + "attn", ref::heads_major(attn, chunks[i].begin, chunks[i].end));
      }
      put("attn/out", ref::reshape(attn, {s_all, d}));
      put("x1", post.x1);
      put("x2", post.x2);
      put("ffn/hidden", post.hidden);
      put("out", post.out);
    }
  }
};

}  // namespace

DIFFCHECK_REGISTER_SCENARIO(DitUlysses)

}  // namespace dc
