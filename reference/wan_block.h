// The token-local parts of a Wan 2.x DiT block (Wan2.2 / MaxDiffusion
// WanTransformerBlock): everything before self-attention (modulation, norm,
// q/k/v with RMSNorm across heads, RoPE, k pre-scaled by D^-1/2) and everything
// after it (output projection and gate, cross-attention, FFN). Token-local, so a
// sequence-parallel rank runs them on its own tokens and the reference on all.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "harness/core/dtype.h"
#include "harness/core/tensor.h"
#include "reference/rope.h"

namespace dc::ref {

struct WanSizes {
  std::size_t dim = 256, heads = 16, head_dim = 16, ffn = 1024;
  std::size_t frames = 4, height = 8, width = 8;  // latent grid after patching
  std::size_t enc_len = 32;                       // text tokens
  std::size_t tokens() const { return frames * height * width; }
  // Wan's RoPE split of D over (frame, row, column): D - 4⌊D/6⌋, 2⌊D/6⌋, 2⌊D/6⌋.
  std::vector<int> rope_axes() const;
};

template <class T>
struct WanWeights {
  BasicTensor<T> table;                                        // adaLN scale-shift table [6, d]
  BasicTensor<T> q_w, q_b, k_w, k_b, v_w, v_b, gq, gk, o_w, o_b;  // self-attention
  BasicTensor<T> n2_g, n2_b;                                   // norm2 (affine)
  BasicTensor<T> cq_w, cq_b, ck_w, ck_b, cv_w, cv_b, cgq, cgk, co_w, co_b;  // cross-attention
  BasicTensor<T> f1_w, f1_b, f2_w, f2_b;                       // FFN
};

template <class T>
WanWeights<T> make_wan_weights(std::uint64_t seed, const WanSizes& z, DType dtype);

// RoPE table for the given token indices; position of token n = (f, h, w) with
// n = (f*height + h)*width + w.
RopeTable wan_rope(const WanSizes& z, const std::vector<std::size_t>& token_positions);

template <class T>
struct WanPre {
  BasicTensor<T> mod;      // [6, d]: shift1, scale1, gate1, shift2, scale2, gate2
  BasicTensor<T> n1;       // [n, d]
  BasicTensor<T> q, k, v;  // [n, heads, D]; q, k normed and rotated, k scaled by D^-1/2
};

template <class T>
using RoundFn = std::function<void(BasicTensor<T>&)>;

// x [n, d], e [6, d] (the time projection for this sample).
template <class T>
WanPre<T> wan_pre_attention(const BasicTensor<T>& x, const BasicTensor<T>& e, const WanWeights<T>& w,
                            const WanSizes& z, const RopeTable& rope, const RoundFn<T>& round);

template <class T>
struct WanPost {
  BasicTensor<T> x1, x2, hidden, out;  // hidden: FFN activation [n, ffn]
};

// attn [n, d]: the self-attention output for these tokens; enc [L, d].
template <class T>
WanPost<T> wan_post_attention(const BasicTensor<T>& x, const BasicTensor<T>& attn,
                              const BasicTensor<T>& mod, const BasicTensor<T>& enc,
                              const WanWeights<T>& w, const WanSizes& z, const RoundFn<T>& round);

}  // namespace dc::ref
