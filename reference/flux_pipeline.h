// A small FLUX-style text-to-image transformer run as a denoising pipeline:
// image tokens (latent patches of C channels) embedded by a linear, text
// tokens by another, N single-stream blocks (reference/flux_block.h) over the
// joint [text | image] sequence, a final adaLN-continuous norm and a linear
// back to C channels: the velocity of flow matching. The guided velocity of
// classifier-free guidance and the Euler step of FLUX's flow-match sampler
// (diffusers' FlowMatchEulerDiscreteScheduler) close the loop.
//
// Written once for the sharded run (float, rounded to the run's dtype after
// every op that yields a tensor) and the float64 reference, on any subset of
// the image tokens: attention is the one place that needs other tokens, and
// the caller supplies it.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "reference/flux_block.h"

namespace dc::ref {

struct PipelineSizes {
  FluxSizes block;            // width, heads, MLP, text tokens, latent grid (img_h x img_w tokens)
  std::size_t channels = 16;  // latent channels of one image token (C)
  std::size_t blocks = 2;     // single-stream blocks
  int freq_dim = 64;          // width of the timestep sinusoid
  double guidance = 4.0;      // classifier-free guidance scale g
  int steps = 28;             // denoising steps
  // "tiny" (tests: d=64, 8 text + 4x8 image tokens, 6 steps) or "default"
  // (d=128, 16 text + 8x16 image tokens, 28 steps as FLUX.1-dev).
  static PipelineSizes preset(const std::string& name);
};

template <class T>
struct PipelineWeights {
  BasicTensor<T> img_in_w, img_in_b;           // [d, C]: latent patch -> hidden
  BasicTensor<T> txt_in_w, txt_in_b;           // [d, d]: prompt embedding -> hidden
  BasicTensor<T> time1_w, time1_b, time2_w, time2_b;  // timestep MLP [d, F], [d, d]
  BasicTensor<T> pooled_w, pooled_b;           // [d, d]: pooled prompt -> conditioning
  BasicTensor<T> norm_out_w, norm_out_b;       // [2d, d]: (scale, shift) of the final norm
  BasicTensor<T> out_w, out_b;                 // [C, d]: hidden -> velocity
  std::vector<FluxWeights<T>> blocks;          // "block{k}." weights
};

// Generated weights (every block whole), rounded to `dtype` when T is float.
// `gen` makes a block of a generated tensor as in make_flux_weights.
template <class T>
PipelineWeights<T> make_pipeline_weights(std::uint64_t seed, const PipelineSizes& z, DType dtype,
                                         const GenerateBlock& gen = {});

template <class T>
using Round = std::function<void(BasicTensor<T>&)>;

// The conditioning of the blocks: MLP(sinusoid(timestep)) + Linear(pooled), [1, d].
// `timestep` is 1000 sigma as the model receives it (a float32 tensor in the
// real pipeline: the caller rounds it).
template <class T>
BasicTensor<T> pipeline_temb(double timestep, const BasicTensor<T>& pooled, const PipelineWeights<T>& w,
                             const PipelineSizes& z, const Round<T>& round);

// Attention of block `block` for this part's rows [text | image rows]: q, k,
// v [rows, heads, D] (q and k normed and rotated, k not scaled) -> [rows, heads, D].
template <class T>
using AttendFn = std::function<BasicTensor<T>(std::size_t block, const BasicTensor<T>& q, const BasicTensor<T>& k,
                                              const BasicTensor<T>& v)>;
// Sees each block's activations and its output [rows, d].
template <class T>
using BlockObserver = std::function<void(std::size_t block, const FluxActivations<T>& a, const BasicTensor<T>& out)>;

// The parts of flux_velocity, for callers that act between them (step caching):
// [Linear(txt) | Linear(x)] [T + n, d]; the blocks; the final norm and
// projection of the image rows (those after the first `text` rows) of h.
template <class T>
BasicTensor<T> embed_tokens(const BasicTensor<T>& x, const BasicTensor<T>& txt, const PipelineWeights<T>& w,
                            const Round<T>& round);
template <class T>
BasicTensor<T> run_blocks(BasicTensor<T> h, const BasicTensor<T>& temb, const PipelineWeights<T>& w,
                          const PipelineSizes& z, const RopeTable& rope, const AttendFn<T>& attend, const Round<T>& round,
                          const BlockObserver<T>& observe = {});
template <class T>
BasicTensor<T> final_layer(const BasicTensor<T>& h, std::size_t text, const BasicTensor<T>& temb,
                           const PipelineWeights<T>& w, const PipelineSizes& z, const Round<T>& round);

// The velocity of the image rows `x` [n, C] given the prompt embedding `txt`
// [T, d] and `temb`; `rope` holds the RoPE rows of [text | these image rows].
template <class T>
BasicTensor<T> flux_velocity(const BasicTensor<T>& x, const BasicTensor<T>& txt, const BasicTensor<T>& temb,
                             const PipelineWeights<T>& w, const PipelineSizes& z, const RopeTable& rope,
                             const AttendFn<T>& attend, const Round<T>& round, const BlockObserver<T>& observe = {});

// v_uncond + g (v_cond - v_uncond), each op rounded as the tensors' dtype would.
template <class T>
BasicTensor<T> cfg_combine(const BasicTensor<T>& v_cond, const BasicTensor<T>& v_uncond, double g,
                           const Round<T>& round);

// x + (sigma_next - sigma) v: the flow-match Euler step (diffusers upcasts to
// float32 for it and casts back: `round` is the latents' dtype).
template <class T>
BasicTensor<T> euler_step(const BasicTensor<T>& x, const BasicTensor<T>& v, double sigma, double sigma_next,
                          const Round<T>& round);

// The final image of latents [n, C] of n image tokens, C = 4 latent channels
// x 2 x 2 pixels packed as FLUX packs them (channel 4c + 2 dy + dx): each
// pixel's 4 channels mapped to RGB by a fixed linear map (the latent-preview
// kind), then (rgb + 1) / 2 clamped to [0, 1]. Returns [n, 2, 2, 3]
// (per-token patches: the layout of the latents' rows).
template <class T>
BasicTensor<T> latents_to_rgb(const BasicTensor<T>& x);

}  // namespace dc::ref
