// Noise-floor calibration over MPI, at the rank count ctest launches:
//  - every scenario's references are the same bits with and without the input
//    perturbation (they are computed inside ReferenceClock, which keeps
//    generation exact), while the run's own taps do move;
//  - flux_tp's floors: an input tap's is one rounding of the dtype, a tap
//    after a long reduction has a wider one than the taps before it, and all
//    ranks get the same floors however the runs were spread.
#include <gtest/gtest.h>

#include <cmath>

#include "harness/core/comm.h"
#include "harness/core/perturbation.h"
#include "harness/run/calibrate.h"
#include "harness/run/scenario.h"
#include "tests/mpi_world.h"

using namespace dc;

namespace {

struct OneDeviceRun {
  std::map<std::string, std::vector<double>> references;  // every box, in order
  std::map<std::string, std::vector<float>> taps;
};

// The scenario's smallest size: "tiny" where it has one.
std::string smallest(const Scenario& s) {
  for (const auto& z : s.sizes())
    if (z == "tiny") return z;
  return "default";
}

OneDeviceRun run_one_device(const Comm& self, const Scenario& s, DType dtype, std::optional<InputPerturbation> p) {
  const Mesh mesh = Mesh::parse(calibration_mesh(s, smallest(s)));
  TapRecorder taps(mesh, 0, dtype);
  {
    const PerturbedInputs scope(p);
    RunContext ctx{mesh, self, taps, FlagValues::resolve(s.flags(), {}, s.name()), "", dtype, 11, smallest(s), {}};
    s.run(ctx);
  }
  OneDeviceRun out;
  for (const auto& [name, part] : taps.references())
    for (const auto& b : part.blocks) out.references[name].insert(out.references[name].end(), b.data.data.begin(), b.data.data.end());
  for (const auto& r : taps.records()) out.taps[r.name] = r.local.data;
  return out;
}

TEST(Calibration, ReferencesStayExactUnderPerturbedInputs) {
  // Each scenario on one rank of four: the spread keeps the test short, and
  // the property is the one-device run's, whatever the world.
  if (world().size() != 4) GTEST_SKIP() << "runs at 4 ranks";
  const Comm self = world().split(Mesh::parse("rank=" + std::to_string(world().size())), {});
  const auto scenarios = all_scenarios();
  for (std::size_t i = 0; i < scenarios.size(); ++i) {
    if (static_cast<int>(i % std::size_t(world().size())) != world().rank()) continue;
    const Scenario& s = *scenarios[i];
    for (DType dtype : {DType::float32, DType::bfloat16}) {
      const OneDeviceRun plain = run_one_device(self, s, dtype, std::nullopt);
      const OneDeviceRun moved = run_one_device(self, s, dtype, InputPerturbation{3, dtype});
      EXPECT_FALSE(plain.references.empty()) << s.name();
      for (const auto& [name, values] : plain.references) {
        ASSERT_EQ(moved.references.count(name), 1u) << s.name() << " " << name;
        EXPECT_TRUE(values == moved.references.at(name)) << s.name() << " " << dtype_name(dtype)
                                                         << ": the reference of '" << name << "' moved";
      }
      std::size_t differ = 0;
      for (const auto& [name, values] : plain.taps) differ += moved.taps.at(name) != values;
      EXPECT_GT(differ, 0u) << s.name() << ": no tap moved with the inputs";
    }
  }
}

TEST(Calibration, FloorsOfFluxTp) {
  const Scenario* s = find_scenario("flux_tp");
  ASSERT_NE(s, nullptr);
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    const NoiseFloorRequest r{s, dtype, 5, "default", FlagValues::resolve(s->flags(), {}, "flux_tp"), {}, 4};
    const Floors f = measure_noise_floors(world(), r);
    const double u = dtype == DType::float32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -8);
    // The input no sharding can change: the dtype's rounding, no more.
    EXPECT_GT(f.at("input/hidden").element, 0.0);
    EXPECT_LE(f.at("input/hidden").element, 2 * u) << dtype_name(dtype);
    EXPECT_LE(f.at("input/hidden").rel_l2, 2 * u) << dtype_name(dtype);
    // After a reduction over d (q) and over d + mlp (proj_out): wider than before it.
    EXPECT_GT(f.at("attn/q").rel_l2, f.at("input/hidden").rel_l2) << dtype_name(dtype);
    EXPECT_GT(f.at("proj_out/partial").rel_l2, f.at("nx").rel_l2) << dtype_name(dtype);
    EXPECT_GT(f.at("proj_out/partial").element, f.at("nx").element) << dtype_name(dtype);
    // Run 0, unperturbed, is measured apart: at most the worst of the runs.
    for (const auto& [name, x] : f) {
      ASSERT_TRUE(x.rel_l2_as_is) << name;
      EXPECT_LE(*x.rel_l2_as_is, x.rel_l2) << name;
    }
    EXPECT_GT(*f.at("proj_out/partial").rel_l2_as_is, 0.0);
    // Every rank holds the same floors.
    const auto all = world().all_gather_strings(encode_floors(f));
    for (const auto& text : all) EXPECT_EQ(text, all.front());
  }
}

}  // namespace
