#include "harness/core/log.h"

#include <fmt/format.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>

namespace dc {

void setup_logging(int rank) {
  auto logger = spdlog::stderr_logger_mt(fmt::format("diffcheck{}", rank));
  std::string prefix = rank >= 0 ? fmt::format("[rank {}] ", rank) : "";
  logger->set_pattern("diffcheck " + prefix + "%^%l%$: %v");
  spdlog::set_default_logger(logger);
  const char* lvl = std::getenv("DIFFCHECK_LOG");
  spdlog::set_level(lvl ? spdlog::level::from_str(lvl) : spdlog::level::warn);
}

}  // namespace dc
