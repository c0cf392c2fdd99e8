// The order compare checks taps in: where stages number their own taps from
// 0, the data's path through the pipeline, not the interleaved numbers.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/capture/tap_order.h"

namespace dc {
namespace {

TapData tap(const std::string& name, long order, int stage = -1) {
  TapData t;
  t.name = name;
  t.order = order;
  if (stage >= 0) t.layout.parse_stage("pp=" + std::to_string(stage));
  return t;
}

std::vector<std::string> names(const std::vector<TapData>& taps) {
  std::vector<std::string> out;
  for (const auto& t : taps) out.push_back(t.name);
  return out;
}

TEST(TapOrder, WithoutStagesTheOrderAttributeThenCreation) {
  std::vector<TapData> taps{tap("b", 1), tap("a", 0), tap("c", 1)};
  taps[2].visit_index = 5;
  TapData unordered;
  unordered.name = "z";
  taps.insert(taps.begin(), unordered);
  sort_taps(taps);
  EXPECT_EQ(names(taps), (std::vector<std::string>{"a", "b", "c", "z"}));
}

// A hand-written two-stage pipeline: each rank numbered its taps from 0.
TEST(TapOrder, StagesForwardFirstToLastBackwardLastToFirstThenParameters) {
  std::vector<TapData> taps{
      tap("layers.1", 0, 1),       tap("grad/layers.1", 1, 1), tap("param_grad/layers.1.w", 2, 1),
      tap("layers.0", 0, 0),       tap("layers.0.fc", 1, 0),   tap("grad/layers.0", 2, 0),
      tap("param_grad/layers.0.w", 3, 0)};
  sort_taps(taps);
  EXPECT_EQ(names(taps), (std::vector<std::string>{"layers.0", "layers.0.fc", "layers.1", "grad/layers.1",
                                                   "grad/layers.0", "param_grad/layers.0.w",
                                                   "param_grad/layers.1.w"}));
}

TEST(TapOrder, StepsBeforePhasesAndTapsOfEveryRankBeforeTheStages) {
  std::vector<TapData> taps{tap("step1/layers.0", 0, 0), tap("step0/grad/layers.0", 1, 0),
                            tap("step0/layers.1", 0, 1), tap("step0/layers.0", 0, 0), tap("step0/tokens", 5)};
  sort_taps(taps);
  EXPECT_EQ(names(taps), (std::vector<std::string>{"step0/tokens", "step0/layers.0", "step0/layers.1",
                                                   "step0/grad/layers.0", "step1/layers.0"}));
}

// A schedule's capture already numbers its taps along the data's path
// (stage span 10^4, phase span 10^6): the key keeps that order.
TEST(TapOrder, AScheduleCapturesOrderIsKept) {
  std::vector<TapData> taps{tap("grad/l0", 1'010'000, 0), tap("l1", 10'000, 1), tap("grad/l1", 1'000'000, 1),
                            tap("l0", 0, 0), tap("l0.fc", 1, 0)};
  sort_taps(taps);
  EXPECT_EQ(names(taps), (std::vector<std::string>{"l0", "l0.fc", "l1", "grad/l1", "grad/l0"}));
}

// An interleaved schedule at 2 ranks: rank 0 (pp=0) holds stages 0 and 2,
// rank 1 (pp=1) stages 1 and 3. Keyed on the rank's coordinate, rank 0's
// stage 2 came before rank 1's stage 1, and a fault entering stage 1 was
// named at stage 2; `pipeline_stage` says the schedule's stage.
TEST(TapOrder, ARankHoldingSeveralStagesIsOrderedByTheSchedulesStage) {
  auto staged = [](const std::string& name, long order, int rank, long schedule_stage) {
    TapData t = tap(name, order, rank);
    t.pipeline_stage = schedule_stage;
    return t;
  };
  std::vector<TapData> taps{staged("l4", 20'000, 0, 2), staged("l2", 10'000, 1, 1), staged("l0", 0, 0, 0),
                            staged("l6", 30'000, 1, 3), staged("grad/l6", 1'000'000, 1, 3),
                            staged("grad/l4", 1'010'000, 0, 2), staged("grad/l2", 1'020'000, 1, 1)};
  sort_taps(taps);
  EXPECT_EQ(names(taps), (std::vector<std::string>{"l0", "l2", "l4", "l6", "grad/l6", "grad/l4", "grad/l2"}));
}

}  // namespace
}  // namespace dc
