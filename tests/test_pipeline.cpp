// The pipeline math of flux_pipeline (reference/flux_pipeline.h) against a
// tiny FLUX-style pipeline computed by PyTorch in float64
// (scripts/fixtures/make_pipeline_fixture.py): the shifted flow-match schedule, the
// timestep and pooled-text conditioning, two single-stream blocks, the final
// norm and projection, the CFG combine and the Euler step, over three steps.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "harness/capture/store.h"
#include "harness/core/error.h"
#include "reference/attention.h"
#include "reference/flux_pipeline.h"
#include "reference/ops.h"
#include "reference/timestep.h"

using namespace dc;

namespace {

class Fixture {
 public:
  explicit Fixture(const std::string& path) : f_(read_activations(path)) {}
  RefTensor get(const std::string& name, Shape shape) const {
    for (const auto& t : f_.taps)
      if (t.name == name) return ref::reshape(RefTensor(t.local_shape, read_whole_piece(f_, t, 0)), std::move(shape));
    ADD_FAILURE() << "fixture has no tap " << name;
    return RefTensor(shape);
  }
  // The generator hook: the block `r` (empty: all) of a fixture tensor of
  // rank 1 or 2, whose values are float32-exact.
  Tensor block(const std::string& name, const Shape& global, const ref::Ranges& r) const {
    const RefTensor all = get(name, global);
    const std::size_t rows = global.size() == 2 ? global[0] : 1, cols = global.back();
    const std::pair<std::size_t, std::size_t> rr = r.empty() || global.size() == 1 ? std::pair<std::size_t, std::size_t>{0, rows} : r[0];
    const std::pair<std::size_t, std::size_t> cr = r.empty() ? std::pair<std::size_t, std::size_t>{0, cols} : r.back();
    Tensor out(global.size() == 2 ? Shape{rr.second - rr.first, cr.second - cr.first} : Shape{cr.second - cr.first});
    std::size_t k = 0;
    for (std::size_t i = rr.first; i < rr.second; ++i)
      for (std::size_t j = cr.first; j < cr.second; ++j) out.data[k++] = static_cast<float>(all.data[i * cols + j]);
    return out;
  }

 private:
  ActivationSet f_;
};

void expect_close(const RefTensor& got, const RefTensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got.data[i], want.data[i], tol) << what << " at " << i;
}

}  // namespace

TEST(Pipeline, SamplerScheduleAndCfgMatchPyTorch) {
  const std::string path = std::string(DIFFCHECK_SOURCE_DIR) + "/tests/fixtures/flux_pipeline_small.h5";
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  const Fixture fx(path);
  ref::PipelineSizes z;
  z.block = {32, 4, 8, 64, 4, 2, 4, {2, 2, 4}};
  z.channels = 8;
  z.blocks = 2;
  z.freq_dim = 16;
  z.guidance = 3.0;
  z.steps = 3;
  const std::size_t d = z.block.dim, img = z.block.img_h * z.block.img_w;
  const ref::GenerateBlock gen = [&](const std::string& name, const Shape& global, float, const ref::Ranges& r) {
    return fx.block(name, global, r);
  };
  const auto w = ref::make_pipeline_weights<double>(0, z, DType::float32, gen);

  const auto schedule = ref::flow_match_schedule(z.steps, int(img));
  expect_close(RefTensor({schedule.sigmas.size()}, schedule.sigmas), fx.get("out/sigmas", {4}), 1e-15, "sigmas");

  const ref::Round<double> exact = [](RefTensor&) {};
  const auto rope = ref::flux_rope(z.block);
  const ref::AttendFn<double> attend = [&](std::size_t, const RefTensor& q, const RefTensor& k, const RefTensor& v) {
    return ref::attention(q, k, v, 1.0 / std::sqrt(double(z.block.head_dim)));
  };
  RefTensor x = fx.get("noise", {img, z.channels});
  const RefTensor prompt = fx.get("prompt", {z.block.txt, d}), empty = fx.get("empty_prompt", {z.block.txt, d});
  const RefTensor pooled = fx.get("pooled_prompt", {d}), pooled_empty = fx.get("pooled_empty", {d});
  for (int t = 0; t < z.steps; ++t) {
    const double ts = 1000.0 * schedule.sigmas[t];
    const auto vc = ref::flux_velocity<double>(x, prompt, ref::pipeline_temb<double>(ts, pooled, w, z, exact), w, z,
                                               rope, attend, exact);
    const auto vu = ref::flux_velocity<double>(x, empty, ref::pipeline_temb<double>(ts, pooled_empty, w, z, exact),
                                               w, z, rope, attend, exact);
    const auto v = ref::cfg_combine<double>(vc, vu, z.guidance, exact);
    x = ref::euler_step<double>(x, v, schedule.sigmas[t], schedule.sigmas[t + 1], exact);
    const std::string s = "out/step" + std::to_string(t) + "/";
    expect_close(vc, fx.get(s + "v_cond", {img, z.channels}), 1e-12, s + "v_cond");
    expect_close(vu, fx.get(s + "v_uncond", {img, z.channels}), 1e-12, s + "v_uncond");
    expect_close(v, fx.get(s + "v", {img, z.channels}), 1e-12, s + "v");
    expect_close(x, fx.get(s + "latents_out", {img, z.channels}), 1e-12, s + "latents_out");
  }
}

TEST(Pipeline, CfgCombineAndEulerStepRoundAsTheirDtype) {
  // v_u + g (v_c - v_u) with each op rounded: the bfloat16 run's arithmetic.
  RefTensor vc({2}, {1.0, 3.0}), vu({2}, {0.5, 1.0});
  int rounds = 0;
  const ref::Round<double> count = [&](RefTensor&) { ++rounds; };
  const auto v = ref::cfg_combine<double>(vc, vu, 4.0, count);
  EXPECT_EQ(v.data, (std::vector<double>{2.5, 9.0}));
  EXPECT_EQ(rounds, 3);
  const auto x = ref::euler_step<double>(vc, vu, 1.0, 0.75, count);
  EXPECT_EQ(x.data, (std::vector<double>{0.875, 2.75}));
  EXPECT_EQ(rounds, 4);
  EXPECT_THROW(ref::cfg_combine<double>(vc, RefTensor({3}), 4.0, count), Error);
}
