#include "harness/capture/tap_order.h"

#include <algorithm>
#include <cctype>
#include <string_view>
#include <tuple>

namespace dc {
namespace {

enum Phase { kForward = 0, kBackward = 1, kParameters = 2 };

// (step, the rest of the name): "step3/grad/x" -> (3, "grad/x"); no prefix: -1.
std::pair<long, std::string_view> split_step(std::string_view name) {
  constexpr std::string_view kStep = "step";
  if (name.substr(0, kStep.size()) != kStep) return {-1, name};
  std::size_t i = kStep.size();
  long step = 0;
  bool digits = false;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i) {
    step = step * 10 + (name[i] - '0');
    digits = true;
  }
  if (!digits || i >= name.size() || name[i] != '/') return {-1, name};
  return {step, name.substr(i + 1)};
}

Phase phase_of(std::string_view rest) {
  auto starts = [&](std::string_view p) { return rest.substr(0, p.size()) == p; };
  if (starts("grad/")) return kBackward;
  if (starts("param/") || starts("param_grad/")) return kParameters;
  return kForward;
}

struct PipelinePlace {
  long step;
  int phase;
  int stage;
};

// The stage as data flows: the schedule's stage where the file says it (a
// rank holding several), else the rank's coordinate on the stage axis.
int stage_of(const TapData& t) {
  return t.pipeline_stage ? static_cast<int>(*t.pipeline_stage) : t.layout.stage_index;
}

PipelinePlace place_of(const TapData& t, int last_stage) {
  auto [step, rest] = split_step(t.name);
  const Phase phase = phase_of(rest);
  int stage = -1;  // a tap every rank holds: before the stages' taps
  if (t.layout.staged()) {
    const int s = stage_of(t);
    stage = phase == kBackward ? last_stage - s : s;
  }
  return {step, phase, stage};
}

bool by_order(const TapData& a, const TapData& b) {
  if (a.order.has_value() != b.order.has_value()) return a.order.has_value();
  if (a.order && *a.order != *b.order) return *a.order < *b.order;
  return a.visit_index < b.visit_index;
}

}  // namespace

void sort_taps(std::vector<TapData>& taps) {
  int last_stage = -1;
  for (const auto& t : taps)
    if (t.layout.staged()) last_stage = std::max(last_stage, stage_of(t));
  if (last_stage < 0) {
    std::stable_sort(taps.begin(), taps.end(), by_order);
    return;
  }
  std::stable_sort(taps.begin(), taps.end(), [last_stage](const TapData& a, const TapData& b) {
    const PipelinePlace pa = place_of(a, last_stage), pb = place_of(b, last_stage);
    if (std::tie(pa.step, pa.phase, pa.stage) != std::tie(pb.step, pb.phase, pb.stage))
      return std::tie(pa.step, pa.phase, pa.stage) < std::tie(pb.step, pb.phase, pb.stage);
    return by_order(a, b);
  });
}

}  // namespace dc
