// The FLUX.1 single-stream block (diffusers' FluxSingleTransformerBlock) up
// to the proj_out product, written once for both the tensor-parallel shard of
// one rank (its heads, its MLP columns, its proj_out columns) and the
// single-rank reference (all of them, float64).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "harness/core/dtype.h"
#include "harness/core/tensor.h"
#include "reference/generate.h"
#include "reference/ops.h"
#include "reference/rope.h"

namespace dc::ref {

struct FluxSizes {
  std::size_t dim, heads, head_dim, mlp, txt, img_h, img_w;
  std::vector<int> rope_axes;
  std::size_t tokens() const { return txt + img_h * img_w; }
  // "default" (d=256, 16x16 heads, M=1024, 32 txt + 14x16 img) or "flux1-dev".
  static FluxSizes preset(const std::string& name);
};

// The proj_out input columns tp rank i of w multiplies by: the non-contiguous
// [i*d/w, (i+1)*d/w) and [d + i*M/w, d + (i+1)*M/w), or with `contiguous` the
// buggy [i*(d+M)/w, (i+1)*(d+M)/w).
ColumnRanges proj_out_columns(const FluxSizes& z, std::size_t w, std::size_t i, bool contiguous);
// Every rank's columns in turn: the packed order tensor parallelism consumes.
ColumnRanges packed_columns(const FluxSizes& z, std::size_t w);

// Weights as one tp rank holds them (PyTorch layout [out, in]).
template <class T>
struct FluxWeights {
  BasicTensor<T> ada_w, ada_b, q_w, q_b, k_w, k_b, v_w, v_b, mlp_w, mlp_b, gq, gk, out_w, out_b;
};

// Makes a block of a generated tensor, as ref::generate(seed, name, global,
// scale, block) does: the reference passes one that shares the work among
// the ranks that all need the same full weights.
using GenerateBlock = std::function<Tensor(const std::string& name, const Shape& global, float scale,
                                           const Ranges& block)>;

// Generated weights of tp rank i of w (w = 1: the full block), rounded to
// `dtype` when T is float. `prefix` goes before every weight's name, so the
// blocks of a model ("block0.", "block1.", ...) differ.
template <class T>
FluxWeights<T> make_flux_weights(std::uint64_t seed, const FluxSizes& z, std::size_t w,
                                 std::size_t i, bool contiguous, DType dtype, const GenerateBlock& gen = {},
                                 const std::string& prefix = "");

// A block of proj_out's generated [d, d + mlp] weight (name, shape and scale
// as make_flux_weights makes it), through `gen` when given.
Tensor proj_out_weight(std::uint64_t seed, const FluxSizes& z, const Ranges& block, const GenerateBlock& gen = {},
                       const std::string& prefix = "");

// FLUX position ids: text tokens (0,0,0), image tokens (0, row, col).
RopeTable flux_rope(const FluxSizes& z);
// The same for some tokens of the [text | image] sequence, by index: a
// sequence-parallel rank's rows (the replicated text, then its image block).
RopeTable flux_rope_rows(const FluxSizes& z, const std::vector<std::size_t>& tokens);

template <class T>
struct FluxActivations {
  BasicTensor<T> ada;      // [1, 3d]: shift, scale, gate
  BasicTensor<T> nx;       // [N, d]
  BasicTensor<T> q, k, v;  // [N, heads, D] (q, k after RMSNorm and RoPE)
  BasicTensor<T> attn;     // [N, heads*D]
  BasicTensor<T> mlp;      // [N, M/w]
  BasicTensor<T> cat;      // [N, heads*D + M/w]
  BasicTensor<T> partial;  // [N, d] = cat · out_wᵀ (+ bias if asked)
};

// Turns one part's rows of k or v ([rows, heads, D]) into all tokens' rows, in
// token order (an all-gather over the ranks that split the tokens).
template <class T>
using GatherTokens = std::function<BasicTensor<T>(const BasicTensor<T>&)>;

// adaLN of the block: ada = Linear(SiLU(temb)) [1, 3d] (shift, scale, gate)
// and the modulated input LayerNorm(h) (1 + scale) + shift [rows, d] — what
// TeaCache-style step caching compares between steps.
template <class T, class W = T>
std::pair<BasicTensor<T>, BasicTensor<T>> flux_modulated_input(const BasicTensor<T>& h, const BasicTensor<T>& temb,
                                                               const FluxWeights<W>& w, const FluxSizes& z,
                                                               const std::function<void(BasicTensor<T>&)>& round);

// The token-local part before attention (fills ada, nx, mlp, q, k, v) of the
// rows of h, whose RoPE rows are `rope`.
// `give_up`, when given, is w itself: each weight is then freed right after
// its last use (the lean forward below).
template <class T, class W = T>
FluxActivations<T> flux_pre_attention(const BasicTensor<T>& h, const BasicTensor<T>& temb, const FluxWeights<W>& w,
                                      const FluxSizes& z, const RopeTable& rope,
                                      const std::function<void(BasicTensor<T>&)>& round,
                                      FluxWeights<W>* give_up = nullptr);
// After attention: `attn` [rows, heads, D] or [rows, heads*D] becomes a.attn,
// then cat = [attn | mlp] and partial = cat · out_wᵀ (+ bias if asked).
template <class T, class W = T>
void flux_post_attention(FluxActivations<T>& a, BasicTensor<T> attn, const FluxWeights<W>& w, bool add_bias,
                         const std::function<void(BasicTensor<T>&)>& round);

// One sample: h [N, d], temb [1, d]. `round` is applied after every op that
// yields a tensor of the run's dtype (no-op for the reference).
//
// Or the query tokens [first_token, first_token + rows) of a sample of
// rope.cos.shape[0] tokens, h holding just those rows: every op is token-local
// except attention, which needs every token's k and v: `gather` collects them
// from the other parts. The activations are this part's rows (k and v too).
//
// The weights' element type W is T, or float for a float64 forward (the
// reference at large sizes): each weight is then widened a block of rows at a
// time inside its product (ref::linear), and the float64 copy of the weights,
// twice their float size, never exists whole.
template <class T, class W = T>
FluxActivations<T> flux_block_forward(const BasicTensor<T>& h, const BasicTensor<T>& temb,
                                      const FluxWeights<W>& w, const FluxSizes& z,
                                      const RopeTable& rope, bool add_bias,
                                      const std::function<void(BasicTensor<T>&)>& round,
                                      std::size_t first_token = 0, const GatherTokens<T>& gather = {});

// out = gate * y + h
// Rows [r0, r1) of proj_out's [d, d + mlp] weight (its output features), as
// generated: the lean forward asks for them a block at a time.
template <class W>
using OutWeightRows = std::function<BasicTensor<W>(std::size_t r0, std::size_t r1)>;

// The same forward for weights too big to hold at once (the float64
// reference of flux1-dev: 452 MB of float32 weights on every rank). Each
// weight of `w` is given up right after its last use, before attention; w
// needs no proj_out weight: its rows come from `out_w_rows` after attention,
// a block at a time, each block given up for the next (linear_by_rows). So
// the weights before attention, the gathered k and v, and proj_out's blocks
// take the same memory in turn (new memory is dear on a VM: docs/usage.md,
// "Memory"), and proj_out's 189 MB never exist whole.
template <class T, class W>
FluxActivations<T> flux_block_forward_lean(const BasicTensor<T>& h, const BasicTensor<T>& temb, FluxWeights<W>&& w,
                                           const OutWeightRows<W>& out_w_rows, const FluxSizes& z,
                                           const RopeTable& rope, bool add_bias,
                                           const std::function<void(BasicTensor<T>&)>& round,
                                           std::size_t first_token = 0, const GatherTokens<T>& gather = {});

template <class T>
BasicTensor<T> gated_residual(const BasicTensor<T>& y, const BasicTensor<T>& ada,
                              const BasicTensor<T>& h);

}  // namespace dc::ref
