#include "harness/run/check_run.h"

#include "harness/capture/recorded.h"
#include "harness/core/agree.h"

namespace dc {

int check_run(const Comm& world, const TapRecorder& taps, const RunInfo& info, const std::string& out,
              CheckPlace place, const ReportOptions& report, std::chrono::steady_clock::time_point started) {
  if (place == CheckPlace::in_memory || world.size() == 1) {
    ReportOptions on_all = report;
    on_all.compare.processes = &world;
    return check_and_report(recorded_activations(world, taps, info, out), on_all, started);
  }
  // Rank 0 alone; the others learn its verdict, or its error, so that every
  // rank ends alike.
  const std::string status = agreed_on_root(world, 0, [&] {
    ReportOptions alone = report;
    alone.compare.processes = nullptr;
    return std::to_string(check_and_report(read_activations(out), alone, started));
  });
  return std::stoi(status);
}

}  // namespace dc
