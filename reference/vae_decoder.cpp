#include "reference/vae_decoder.h"

#include <cmath>

#include "harness/core/error.h"
#include "reference/generate.h"

namespace dc::ref {

VaeSizes VaeSizes::preset(const std::string& size) {
  if (size == "default") return {};
  // Small enough for the nightly's mesh matrix, yet 8 x 8 latents give 1 pixel
  // wide tiles at ph or pw = 8 and a 32 x 32 image (SSIM needs 7 x 7).
  if (size == "tiny") return {.batch = 2, .latent_channels = 4, .height = 8, .width = 8, .channels = 16, .groups = 4};
  input_error("vae_patch_decode: unknown size '{}' (known: default, tiny)", size);
}

std::vector<std::string> VaeSizes::presets() { return {"default", "tiny"}; }

namespace {

template <class T>
Conv3x3<T> make_conv(std::uint64_t seed, const std::string& name, std::size_t cin, std::size_t cout, DType dtype) {
  // Variance 1 / (9 cin): activations keep their scale through the layers.
  const float scale = std::sqrt(3.0f / float(9 * cin));
  return {as_run_values<T>(generate(seed, name + ".weight", {cout, cin, 3, 3}, scale), dtype),
          as_run_values<T>(generate(seed, name + ".bias", {cout}, 0.1f), dtype)};
}

template <class T>
GroupNormParams<T> make_norm(std::uint64_t seed, const std::string& name, std::size_t c, DType dtype) {
  Tensor gamma = generate(seed, name + ".weight", {c}, 0.2f);
  for (float& g : gamma.data) g += 1.0f;
  return {as_run_values<T>(gamma, dtype), as_run_values<T>(generate(seed, name + ".bias", {c}, 0.1f), dtype)};
}

}  // namespace

template <class T>
VaeDecoderWeights<T> make_vae_weights(std::uint64_t seed, const VaeSizes& z, DType dtype) {
  const std::size_t c = z.channels;
  return {make_conv<T>(seed, "vae.conv_in", z.latent_channels, c, dtype),
          make_conv<T>(seed, "vae.res0.conv1", c, c, dtype),
          make_conv<T>(seed, "vae.res0.conv2", c, c, dtype),
          make_conv<T>(seed, "vae.up0.conv", c, c, dtype),
          make_conv<T>(seed, "vae.up1.conv", c, c, dtype),
          make_conv<T>(seed, "vae.conv_out", c, 3, dtype),
          make_norm<T>(seed, "vae.res0.norm1", c, dtype),
          make_norm<T>(seed, "vae.res0.norm2", c, dtype),
          make_norm<T>(seed, "vae.norm_out", c, dtype)};
}

template <class T>
void conv3x3_rect(const T* padded, std::size_t h, std::size_t w, const Conv3x3<T>& c, T* out, PixelRect rect) {
  const std::size_t cin = c.cin(), cout = c.cout(), wp = w + 2;
  if (rect.i0 >= rect.i1 || rect.j0 >= rect.j1) return;
  const std::size_t len = rect.j1 - rect.j0;
  for (std::size_t co = 0; co < cout; ++co) {
    T* plane = out + co * h * w;
    for (std::size_t i = rect.i0; i < rect.i1; ++i)
      for (std::size_t j = rect.j0; j < rect.j1; ++j) plane[i * w + j] = c.bias.data[co];
    const T* wt = c.weight.data.data() + co * cin * 9;
    for (std::size_t ci = 0; ci < cin; ++ci)
      for (std::size_t ky = 0; ky < 3; ++ky)
        for (std::size_t kx = 0; kx < 3; ++kx) {
          const T k = wt[(ci * 3 + ky) * 3 + kx];
          for (std::size_t i = rect.i0; i < rect.i1; ++i) {
            const T* src = padded + (ci * (h + 2) + i + ky) * wp + kx + rect.j0;
            T* dst = plane + i * w + rect.j0;
            for (std::size_t j = 0; j < len; ++j) dst[j] += k * src[j];
          }
        }
  }
}

template <class T>
BasicTensor<T> pad1(const BasicTensor<T>& x) {
  const std::size_t n = x.shape[0], ch = x.shape[1], h = x.shape[2], w = x.shape[3];
  BasicTensor<T> p({n, ch, h + 2, w + 2});
  for (std::size_t plane = 0; plane < n * ch; ++plane)
    for (std::size_t i = 0; i < h; ++i)
      std::copy_n(x.data.data() + (plane * h + i) * w, w, p.data.data() + (plane * (h + 2) + i + 1) * (w + 2) + 1);
  return p;
}

template <class T>
BasicTensor<T> conv3x3(const BasicTensor<T>& x, const Conv3x3<T>& c) {
  const std::size_t n = x.shape[0], h = x.shape[2], w = x.shape[3];
  if (x.shape[1] != c.cin()) fail("conv3x3: input has {} channels, the weight {}", x.shape[1], c.cin());
  const BasicTensor<T> p = pad1(x);
  BasicTensor<T> out({n, c.cout(), h, w});
  for (std::size_t b = 0; b < n; ++b)
    conv3x3_rect(p.data.data() + b * c.cin() * (h + 2) * (w + 2), h, w, c, out.data.data() + b * c.cout() * h * w,
                 {0, h, 0, w});
  return out;
}

template <class T>
BasicTensor<T> upsample2(const BasicTensor<T>& x) {
  const std::size_t planes = x.shape[0] * x.shape[1], h = x.shape[2], w = x.shape[3];
  BasicTensor<T> out({x.shape[0], x.shape[1], 2 * h, 2 * w});
  for (std::size_t p = 0; p < planes; ++p)
    for (std::size_t i = 0; i < 2 * h; ++i) {
      const T* src = x.data.data() + (p * h + i / 2) * w;
      T* dst = out.data.data() + (p * 2 * h + i) * 2 * w;
      for (std::size_t j = 0; j < 2 * w; ++j) dst[j] = src[j / 2];
    }
  return out;
}

template <class T>
void group_norm_silu(BasicTensor<T>& x, const BasicTensor<T>& stats, const GroupNormParams<T>& p) {
  const std::size_t n = x.shape[0], ch = x.shape[1], hw = x.shape[2] * x.shape[3], groups = stats.shape[1];
  const std::size_t per = ch / groups;
  for (std::size_t b = 0; b < n; ++b)
    for (std::size_t c = 0; c < ch; ++c) {
      const std::size_t g = c / per;
      const T mean = stats.data[(b * groups + g) * 2], var = stats.data[(b * groups + g) * 2 + 1];
      const T scale = p.gamma.data[c] / std::sqrt(var + T(kGroupNormEps)), shift = p.beta.data[c] - mean * scale;
      T* v = x.data.data() + (b * ch + c) * hw;
      for (std::size_t i = 0; i < hw; ++i) {
        const T y = v[i] * scale + shift;
        v[i] = y / (T(1) + std::exp(-y));
      }
    }
}

namespace {

// Mean and variance per item and group of the whole x [n, C, h, w], two-pass in double.
template <class T>
BasicTensor<T> whole_group_stats(const BasicTensor<T>& x, std::size_t groups) {
  const std::size_t n = x.shape[0], ch = x.shape[1], hw = x.shape[2] * x.shape[3];
  const std::size_t count = ch / groups * hw;
  BasicTensor<T> stats({n, groups, 2});
  for (std::size_t b = 0; b < n; ++b)
    for (std::size_t g = 0; g < groups; ++g) {
      const T* v = x.data.data() + (b * ch + g * (ch / groups)) * hw;
      double sum = 0, sq = 0;
      for (std::size_t i = 0; i < count; ++i) sum += double(v[i]);
      const double mean = sum / double(count);
      for (std::size_t i = 0; i < count; ++i) sq += (double(v[i]) - mean) * (double(v[i]) - mean);
      stats.data[(b * groups + g) * 2] = T(mean);
      stats.data[(b * groups + g) * 2 + 1] = T(sq / double(count));
    }
  return stats;
}

}  // namespace

template <class T>
void vae_decode(const BasicTensor<T>& latents, const VaeDecoderWeights<T>& w, std::size_t groups,
                const std::function<void(const std::string&, const BasicTensor<T>&)>& tap) {
  auto norm = [&](const std::string& name, BasicTensor<T> x, const GroupNormParams<T>& p) {
    const BasicTensor<T> stats = whole_group_stats(x, groups);
    tap(name + "/stats", stats);
    group_norm_silu(x, stats, p);
    tap(name + "/out", x);
    return x;
  };
  tap("latents", latents);
  const BasicTensor<T> h0 = conv3x3(latents, w.conv_in);
  tap("conv_in", h0);
  BasicTensor<T> h = norm("res0/norm1", h0, w.res_norm1);
  h = conv3x3(h, w.res_conv1);
  tap("res0/conv1", h);
  h = norm("res0/norm2", h, w.res_norm2);
  h = conv3x3(h, w.res_conv2);
  tap("res0/conv2", h);
  for (std::size_t i = 0; i < h.data.size(); ++i) h.data[i] += h0.data[i];
  tap("res0/out", h);
  h = conv3x3(upsample2(h), w.up0_conv);
  tap("up0/conv", h);
  h = conv3x3(upsample2(h), w.up1_conv);
  tap("up1/conv", h);
  h = norm("norm_out", h, w.norm_out);
  tap("image", conv3x3(h, w.conv_out));
}

#define DC_INSTANTIATE(T)                                                                                         \
  template VaeDecoderWeights<T> make_vae_weights<T>(std::uint64_t, const VaeSizes&, DType);                      \
  template void conv3x3_rect<T>(const T*, std::size_t, std::size_t, const Conv3x3<T>&, T*, PixelRect);           \
  template BasicTensor<T> pad1<T>(const BasicTensor<T>&);                                                         \
  template BasicTensor<T> conv3x3<T>(const BasicTensor<T>&, const Conv3x3<T>&);                                   \
  template BasicTensor<T> upsample2<T>(const BasicTensor<T>&);                                                    \
  template void group_norm_silu<T>(BasicTensor<T>&, const BasicTensor<T>&, const GroupNormParams<T>&);           \
  template void vae_decode<T>(const BasicTensor<T>&, const VaeDecoderWeights<T>&, std::size_t,                   \
                              const std::function<void(const std::string&, const BasicTensor<T>&)>&);
DC_INSTANTIATE(float)
DC_INSTANTIATE(double)
#undef DC_INSTANTIATE

}  // namespace dc::ref
