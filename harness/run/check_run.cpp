#include "harness/run/check_run.h"

#include <fmt/format.h>

#include "harness/capture/recorded.h"
#include "harness/core/error.h"

namespace dc {

int check_run(const Comm& world, const TapRecorder& taps, const RunInfo& info, const std::string& out,
              CheckPlace place, const ReportOptions& report, std::chrono::steady_clock::time_point started) {
  if (place == CheckPlace::in_memory || world.size() == 1) {
    ReportOptions on_all = report;
    on_all.compare.processes = &world;
    return check_and_report(recorded_activations(world, taps, info, out), on_all, started);
  }
  // Rank 0 alone; the others learn its verdict, or its error, so that every
  // rank ends alike: "S<status>", "I<input error>" or "E<error>".
  std::string outcome;
  if (world.rank() == 0) {
    try {
      ReportOptions alone = report;
      alone.compare.processes = nullptr;
      outcome = fmt::format("S{}", check_and_report(read_activations(out), alone, started));
    } catch (const InputError& e) {
      outcome = std::string("I") + e.what();
    } catch (const std::exception& e) {
      outcome = std::string("E") + e.what();
    }
  }
  outcome = world.broadcast_string(outcome, 0);
  if (outcome.empty()) fail("rank {}: no verdict from rank 0's check of {}", world.rank(), out);
  if (outcome[0] == 'I') throw InputError(outcome.substr(1));
  if (outcome[0] == 'E') throw Error(outcome.substr(1));
  return std::stoi(outcome.substr(1));
}

}  // namespace dc
