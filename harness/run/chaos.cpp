#include "harness/run/chaos.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <csignal>
#include <thread>

#include "harness/capture/tap.h"
#include "harness/core/comm.h"
#include "harness/core/error.h"
#include "harness/core/progress.h"

namespace dc {

Chaos::Chaos(const std::string& spec, int world_size) : spec_(spec) {
  if (spec.empty()) return;
  auto usage = [&] {
    input_error(
        "--chaos '{}': expected crash@RANK, hang@RANK, desync@RANK or slow@RANK, optionally :after=TAP or "
        ":during=write|check (RANK < {})",
        spec, world_size);
  };
  const auto at = spec.find('@');
  if (at == std::string::npos) usage();
  const std::string kind = spec.substr(0, at);
  std::string rest = spec.substr(at + 1);
  if (auto colon = rest.find(':'); colon != std::string::npos) {
    if (rest.compare(colon + 1, 6, "after=") == 0 && rest.size() > colon + 7) {
      after_ = rest.substr(colon + 7);
    } else if (rest.compare(colon + 1, 7, "during=") == 0) {
      during_ = rest.substr(colon + 8);
      if (during_ != "write" && during_ != "check") usage();
    } else {
      usage();
    }
    rest = rest.substr(0, colon);
  }
  kind_ = kind == "crash"    ? Kind::crash
          : kind == "hang"   ? Kind::hang
          : kind == "desync" ? Kind::desync
          : kind == "slow"   ? Kind::slow
                             : Kind::none;
  if (kind_ == Kind::none || rest.empty() || rest.find_first_not_of("0123456789") != std::string::npos) usage();
  rank_ = std::stoi(rest);
  if (rank_ >= world_size) usage();
}

void Chaos::act(const std::string& where, Comm& world) {
  done_ = true;
  spdlog::warn("--chaos: {} {}", spec_, where);
  if (kind_ == Kind::crash) std::raise(SIGSEGV);
  if (kind_ == Kind::hang)
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  if (kind_ == Kind::desync) world.barrier();  // a collective nobody else calls
  if (kind_ == Kind::slow) {  // alive and working, as a long check of the run file is
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (std::chrono::steady_clock::now() < end) {
      progress::working();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

void Chaos::arm(TapRecorder& taps, Comm& world, int rank) {
  if (rank != rank_ || !during_.empty()) return;
  taps.on_tap([this, &world](const std::string& name) {
    if (done_ || (!after_.empty() && name != after_)) return;
    act(fmt::format("after tap '{}'", name), world);
  });
}

void Chaos::during(const char* phase, Comm& world, int rank) {
  if (rank == rank_ && during_ == phase)
    act(during_ == "write" ? "once the run file is created" : "as the check starts", world);
}

void Chaos::warn_if_unused(int rank) const {
  if (rank == rank_ && during_.empty() && !done_)
    spdlog::warn("--chaos {}: rank {} never recorded tap '{}'; nothing was injected", spec_, rank, after_);
}

}  // namespace dc
