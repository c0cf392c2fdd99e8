#include "scenarios/joint_attention.h"

#include <cmath>

#include "harness/core/error.h"
#include "reference/attention.h"
#include "reference/ops.h"

namespace dc {
namespace {

// [h, a, D] and [h, b, D] -> [h, a + b, D] (joined along the tokens).
Tensor join_tokens(const Tensor& x, const Tensor& y) {
  return ref::heads_major(ref::concat_rows(ref::token_major(x), ref::token_major(y)), 0, x.shape[0]);
}

}  // namespace

Tensor joint_usp_attention(const Comm& sp, const Comm& ring, std::size_t text, const Tensor& q, const Tensor& k,
                           const Tensor& v, const JointAttentionOptions& opt) {
  if (q.rank() != 3 || q.shape != k.shape || q.shape != v.shape || q.shape[0] < text)
    fail("joint_usp_attention: q {} k {} v {} must be equal [text + image rows, H, D] with {} text rows",
         shape_str(q.shape), shape_str(k.shape), shape_str(v.shape), text);
  const std::size_t rows = q.shape[0], heads = q.shape[1], hd = q.shape[2];
  const std::size_t p = static_cast<std::size_t>(sp.size()), me = static_cast<std::size_t>(sp.rank());
  // k pre-scaled by D^-1/2, as the kernels take it (exact when D is a power of 4).
  Tensor ks = k;
  const float scale = static_cast<float>(1.0 / std::sqrt(double(hd)));
  for (auto& x : ks.data) x *= scale;
  round_to(opt.ring.dtype, ks.data);
  const Tensor q_txt = ref::take_rows(q, 0, text), k_txt = ref::take_rows(ks, 0, text), v_txt = ref::take_rows(v, 0, text);
  const Tensor q_img = ref::take_rows(q, text, rows), k_img = ref::take_rows(ks, text, rows),
               v_img = ref::take_rows(v, text, rows);

  const auto chunks = ulysses_head_chunks(heads, p, opt.ulysses.chunks);
  std::vector<Tensor> text_out(chunks.size());  // per chunk: [heads of this rank, text, D]
  UlyssesOptions uo = opt.ulysses;
  uo.attend = [&](std::size_t c, const Tensor& qc, const Tensor& kc, const Tensor& vc) {
    const std::size_t hp = (chunks[c].end - chunks[c].begin) / p, h0 = chunks[c].begin + me * hp;
    const Tensor qt = ref::heads_major(q_txt, h0, h0 + hp), kt = ref::heads_major(k_txt, h0, h0 + hp),
                 vt = ref::heads_major(v_txt, h0, h0 + hp);
    const Tensor queries = join_tokens(qt, qc);
    Tensor out;
    if (!opt.fault_text_kv_rotated || opt.fault_scale != 1.0) {
      Tensor lse;
      std::tie(out, lse) = ring_attention(ring, queries, kc, vc, opt.ring, {});
      auto [o_txt, l_txt] = block_attention(queries, kt, vt);
      round_to(opt.ring.dtype, o_txt.data);
      Tensor lse_tokens = ref::transpose2(lse);
      lse_merge(out, lse_tokens, o_txt, ref::transpose2(l_txt), opt.ring.sigmoid_merge);
      round_to(opt.ring.dtype, out.data);
    }
    if (opt.fault_text_kv_rotated) {
      Tensor rotated = ring_attention(ring, queries, join_tokens(kt, kc), join_tokens(vt, vc), opt.ring, {}).first;
      if (opt.fault_scale != 1.0) {
        // --fault-scale A: A of the way from the right output to the rotated one.
        for (std::size_t i = 0; i < out.data.size(); ++i)
          rotated.data[i] = static_cast<float>(out.data[i] + opt.fault_scale * (rotated.data[i] - out.data[i]));
        round_to(opt.ring.dtype, rotated.data);
      }
      out = std::move(rotated);
    }
    // The text queries' output is the same on every ring rank up to rounding:
    // each merges the ring's blocks in its own order. Ring rank 0's copy is
    // the one kept, so the replicated text rows stay bitwise equal (a replica
    // that drifts is what this harness reports as a bug).
    text_out[c] = ref::token_rows(out, 0, text);
    ring.broadcast(std::span<float>(text_out[c].data), 0);
    return ref::token_rows(out, text, out.shape[1]);
  };
  Tensor img = ulysses_attention(sp, q_img, k_img, v_img, uo, {});

  // Each rank has the text rows for its heads of each chunk: gather the heads.
  Tensor txt({text, heads, hd});
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    const std::size_t hp = (chunks[c].end - chunks[c].begin) / p;
    const std::vector<float> all = sp.all_gather(std::span<const float>(text_out[c].data));  // [p][hp, text, D]
    for (std::size_t j = 0; j < p * hp; ++j)
      for (std::size_t i = 0; i < text; ++i)
        std::copy(all.begin() + (j * text + i) * hd, all.begin() + (j * text + i + 1) * hd,
                  txt.ptr() + (i * heads + chunks[c].begin + j) * hd);
  }
  return ref::concat_rows(txt, img);
}

RefTensor joint_reference_attention(std::size_t text, const RefTensor& q, const RefTensor& k, const RefTensor& v,
                                    const std::function<RefTensor(const RefTensor&)>& gather_image) {
  const std::size_t rows = q.shape[0];
  const RefTensor keys = ref::concat_rows(ref::take_rows(k, 0, text), gather_image(ref::take_rows(k, text, rows)));
  const RefTensor values = ref::concat_rows(ref::take_rows(v, 0, text), gather_image(ref::take_rows(v, text, rows)));
  return ref::attention(q, keys, values, 1.0 / std::sqrt(double(q.shape[2])));
}

}  // namespace dc
