// A small decoder in the shape of a diffusion VAE's (AutoencoderKL): conv3x3
// in, one ResNet block (GroupNorm, SiLU, conv3x3, twice, and the skip),
// nearest upsampling x2 with a conv3x3 after it, twice, then GroupNorm, SiLU
// and conv3x3 to RGB. Latents [C_lat, H, W] of one item give an image
// [3, 4H, 4W]. The same code is the float64 reference and, on tiles, the
// sharded run's kernels (scenarios/vae_patch_decode_run.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "harness/core/dtype.h"
#include "harness/core/tensor.h"

namespace dc::ref {

struct VaeSizes {
  std::size_t batch = 4, latent_channels = 4, height = 16, width = 16, channels = 32, groups = 8;
  static VaeSizes preset(const std::string& size);  // "default" or "tiny"; throws InputError
  static std::vector<std::string> presets();
};

template <class T>
struct Conv3x3 {
  BasicTensor<T> weight;  // [cout, cin, 3, 3]
  BasicTensor<T> bias;    // [cout]
  std::size_t cin() const { return weight.shape[1]; }
  std::size_t cout() const { return weight.shape[0]; }
};

template <class T>
struct GroupNormParams {
  BasicTensor<T> gamma, beta;  // [C]
};

template <class T>
struct VaeDecoderWeights {
  Conv3x3<T> conv_in, res_conv1, res_conv2, up0_conv, up1_conv, conv_out;
  GroupNormParams<T> res_norm1, res_norm2, norm_out;
};

// Deterministic weights (reference/generate.h), rounded to `dtype` for T = float.
template <class T>
VaeDecoderWeights<T> make_vae_weights(std::uint64_t seed, const VaeSizes& z, DType dtype);

inline constexpr double kGroupNormEps = 1e-6;

// Output pixels [i0, i1) x [j0, j1) of a tile.
struct PixelRect {
  std::size_t i0 = 0, i1 = 0, j0 = 0, j1 = 0;
};

// out[co, i, j] of out [cout, h, w] for the pixels of `rect`, from `padded`
// [cin, h + 2, w + 2] (the input with a one-pixel border: zeros at the
// image's edge, the neighbours' rows and columns inside it). Each pixel sums
// the bias, then ci, ky, kx in that order whatever the rectangle: a tile
// computed in pieces (interior first, borders later) equals the tile computed
// at once, and a tile with its halos equals the same pixels of the whole image,
// bitwise.
template <class T>
void conv3x3_rect(const T* padded, std::size_t h, std::size_t w, const Conv3x3<T>& c, T* out, PixelRect rect);

// [n, C, h, w] -> [n, C, h + 2, w + 2] with a zero border.
template <class T>
BasicTensor<T> pad1(const BasicTensor<T>& x);

// The whole of conv3x3 over x [n, C, h, w] with zero padding: [n, cout, h, w].
template <class T>
BasicTensor<T> conv3x3(const BasicTensor<T>& x, const Conv3x3<T>& c);

// Nearest upsampling x2: [n, C, h, w] -> [n, C, 2h, 2w].
template <class T>
BasicTensor<T> upsample2(const BasicTensor<T>& x);

// GroupNorm with the given statistics, then SiLU, in place on x [n, C, h, w].
// stats [n, groups, 2] holds (mean, variance) per item and group.
template <class T>
void group_norm_silu(BasicTensor<T>& x, const BasicTensor<T>& stats, const GroupNormParams<T>& p);

// The decoder on one item's latents [C_lat, H, W] (as [1, C_lat, H, W]),
// calling tap(name, value) with each layer's output in order: the names and
// shapes the scenario taps (without the batch split). Statistics of GroupNorm
// are of the whole image, in double.
template <class T>
void vae_decode(const BasicTensor<T>& latents, const VaeDecoderWeights<T>& w, std::size_t groups,
                const std::function<void(const std::string&, const BasicTensor<T>&)>& tap);

}  // namespace dc::ref
