#include "harness/check/images.h"

#include <algorithm>
#include <cmath>
#include <regex>
#include <set>
#include <tuple>

#include "harness/core/comm.h"
#include "harness/core/error.h"
#include "harness/check/image_metrics.h"

namespace dc {
namespace {

Slab whole(const Shape& s) { return Slab{Shape(s.size(), 0), s}; }

// One image [H, W, C] of item b of the global tensor.
std::vector<double> item_image(const std::vector<double>& global, const ImageGeometry& g, std::size_t b) {
  const std::size_t per = g.height * g.width * g.channels;
  std::vector<double> img(per);
  const double* src = global.data() + b * per;
  if (g.channels_first) {
    const std::size_t hw = g.height * g.width;
    for (std::size_t c = 0; c < g.channels; ++c)
      for (std::size_t i = 0; i < hw; ++i) img[i * g.channels + c] = src[c * hw + i];
    return img;
  }
  if (!g.patch) return std::vector<double>(src, src + per);
  const std::size_t p = g.patch, ch = g.channels;
  for (std::size_t t = 0; t < g.grid_h * g.grid_w; ++t)
    for (std::size_t dy = 0; dy < p; ++dy)
      for (std::size_t dx = 0; dx < p; ++dx)
        for (std::size_t c = 0; c < ch; ++c)
          img[(((t / g.grid_w) * p + dy) * g.width + (t % g.grid_w) * p + dx) * ch + c] =
              src[((t * p + dy) * p + dx) * ch + c];
  return img;
}

// The value range images of this reference are meant in: (low, extent).
std::pair<double, double> data_range(const std::vector<double>& ref) {
  const auto [lo, hi] = std::minmax_element(ref.begin(), ref.end());
  if (*lo >= 0 && *hi <= 1) return {0.0, 1.0};
  if (*lo >= 0 && *hi <= 255) return {0.0, 255.0};
  return {*lo, std::max(*hi - *lo, 1e-300)};
}

}  // namespace

ImageGeometry image_geometry(const TapData& t) {
  if (!t.reference_shape) input_error("tap '{}': an image tap needs a reference to be judged", t.name);
  const Shape& s = *t.reference_shape;
  ImageGeometry g;
  static const std::regex kPatches(R"(patches:([1-9][0-9]*),([1-9][0-9]*))");
  std::smatch m;
  if (t.image == "nhwc") {
    if (s.size() != 4) input_error("tap '{}': attribute image=nhwc needs a [B, H, W, C] tensor, it is {}", t.name, shape_str(s));
    g = {s[0], s[1], s[2], s[3]};
  } else if (t.image == "nchw") {
    if (s.size() != 4) input_error("tap '{}': attribute image=nchw needs a [B, C, H, W] tensor, it is {}", t.name, shape_str(s));
    g = {s[0], s[2], s[3], s[1]};
    g.channels_first = true;
  } else if (std::regex_match(t.image, m, kPatches)) {
    const std::size_t h = std::stoul(m[1].str()), w = std::stoul(m[2].str());
    if (s.size() != 5 || s[1] != h * w || s[2] != s[3])
      input_error("tap '{}': attribute image={} needs a [B, {}, p, p, C] tensor, it is {}", t.name, t.image, h * w,
                  shape_str(s));
    g = {s[0], h * s[2], w * s[2], s[4], h, w, s[2]};
  } else {
    input_error("tap '{}': attribute image is '{}' (expected nhwc, nchw or patches:H,W)", t.name, t.image);
  }
  if (g.height < 7 || g.width < 7)
    input_error("tap '{}': images of {} x {} pixels are too small for SSIM's 7 x 7 window", t.name, g.height, g.width);
  return g;
}

std::vector<ImageVerdict> judge_images(const ActivationSet& set, const CompareOptions& opts) {
  const Comm* holders = set.data->holders();
  const bool first = holders ? holders->rank() == 0 : (!opts.processes || opts.processes->rank() == 0);
  std::vector<ImageVerdict> out;
  for (const auto& t : set.taps) {
    if (t.image.empty() || !t.reference_shape) continue;
    const ImageGeometry g = image_geometry(t);
    // The replica-group leaders' pieces and the reference, to the first process.
    std::set<int> leaders;
    for (int r = 0; r < set.world_size; ++r)
      if (t.layout.owns(set.mesh, r)) leaders.insert(t.layout.replica_leader(set.mesh, r));
    std::vector<PlannedRead> reads;
    for (int r : leaders) reads.push_back({0, r, whole(t.local_shape)});
    reads.push_back({0, -1, whole(*t.reference_shape)});
    if (holders) set.data->stage(t, reads);
    if (!first) continue;
    std::vector<std::vector<double>> pieces(set.world_size);
    for (int r : leaders) pieces[r] = read_whole_piece(set, t, r);
    const std::vector<double> got = reassemble(t.layout, set.mesh, t.local_shape,
                                               [&](int r) { return pieces[t.layout.replica_leader(set.mesh, r)].data(); });
    const std::vector<double> want = read_whole_reference(set, t);
    for (std::size_t b = 0; b < g.batch; ++b) {
      ImageVerdict v{t.name, b, g.height, g.width, g.channels};
      v.image = item_image(got, g, b);
      v.reference = item_image(want, g, b);
      std::tie(v.data_low, v.data_range) = data_range(v.reference);
      const RefTensor a({g.height, g.width, g.channels}, v.reference), x({g.height, g.width, g.channels}, v.image);
      v.psnr = psnr(a, x, v.data_range);
      v.ssim = ssim(a, x, v.data_range);
      v.gate_pass = v.ssim >= kGateSsim && v.psnr >= kGatePsnr;
      out.push_back(std::move(v));
    }
  }
  return out;
}

}  // namespace dc
