#include "harness/run/agree_options.h"

#include <fmt/format.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "harness/core/flags.h"

namespace dc {

namespace {

// Every option the ranks act on, by name, in one table that serves both
// directions: a field cannot be sent in one place and read back in another.
using Get = std::string (*)(const RunOptions&);
using Set = void (*)(RunOptions&, const std::string&);
struct Field {
  const char* name;
  Get get;
  Set set;
};
const auto num = [](double v) { return fmt::format("{:.17g}", v); };
const auto opt = [](const std::optional<double>& v) {
  return v ? num(*v) : std::string();
};
const auto parse_opt = [](const std::string& s) {
  return s.empty() ? std::optional<double>{} : std::optional<double>{std::stod(s)};
};
const Field fields[] = {
    {"scenario", [](const RunOptions& o) { return o.scenario; },
     [](RunOptions& o, const std::string& v) { o.scenario = v; }},
    {"mesh", [](const RunOptions& o) { return o.mesh; },
     [](RunOptions& o, const std::string& v) { o.mesh = v; }},
    {"dtype", [](const RunOptions& o) { return o.dtype; },
     [](RunOptions& o, const std::string& v) { o.dtype = v; }},
    {"seed", [](const RunOptions& o) { return std::to_string(o.seed); },
     [](RunOptions& o, const std::string& v) { o.seed = std::stoull(v); }},
    {"fault", [](const RunOptions& o) { return o.fault; },
     [](RunOptions& o, const std::string& v) { o.fault = v; }},
    {"fault_scale", [](const RunOptions& o) { return num(o.fault_scale); },
     [](RunOptions& o, const std::string& v) { o.fault_scale = std::stod(v); }},
    {"tolerance", [](const RunOptions& o) { return o.tolerance; },
     [](RunOptions& o, const std::string& v) { o.tolerance = v; }},
    {"tolerances_file", [](const RunOptions& o) { return o.tolerances_file; },
     [](RunOptions& o, const std::string& v) { o.tolerances_file = v; }},
    {"calibration_runs", [](const RunOptions& o) { return std::to_string(o.calibration_runs); },
     [](RunOptions& o, const std::string& v) { o.calibration_runs = std::stoi(v); }},
    {"size", [](const RunOptions& o) { return o.size; },
     [](RunOptions& o, const std::string& v) { o.size = v; }},
    {"steps", [](const RunOptions& o) { return std::to_string(o.pipeline.steps); },
     [](RunOptions& o, const std::string& v) { o.pipeline.steps = std::stoi(v); }},
    {"reference_mode", [](const RunOptions& o) { return o.pipeline.reference_mode; },
     [](RunOptions& o, const std::string& v) { o.pipeline.reference_mode = v; }},
    {"tap_blocks", [](const RunOptions& o) { return o.pipeline.tap_blocks; },
     [](RunOptions& o, const std::string& v) { o.pipeline.tap_blocks = v; }},
    {"out", [](const RunOptions& o) { return o.out; },
     [](RunOptions& o, const std::string& v) { o.out = v; }},
    {"store", [](const RunOptions& o) { return o.store; },
     [](RunOptions& o, const std::string& v) { o.store = v; }},
    {"html", [](const RunOptions& o) { return o.report.html_path; },
     [](RunOptions& o, const std::string& v) { o.report.html_path = v; }},
    {"junit", [](const RunOptions& o) { return o.report.junit_path; },
     [](RunOptions& o, const std::string& v) { o.report.junit_path = v; }},
    {"json", [](const RunOptions& o) { return o.report.json_path; },
     [](RunOptions& o, const std::string& v) { o.report.json_path = v; }},
    {"atol", [](const RunOptions& o) { return opt(o.report.compare.atol); },
     [](RunOptions& o, const std::string& v) { o.report.compare.atol = parse_opt(v); }},
    {"rtol", [](const RunOptions& o) { return opt(o.report.compare.rtol); },
     [](RunOptions& o, const std::string& v) { o.report.compare.rtol = parse_opt(v); }},
    {"replica_ulps",
     [](const RunOptions& o) { return std::to_string(o.report.compare.replica_ulps); },
     [](RunOptions& o, const std::string& v) { o.report.compare.replica_ulps = std::stol(v); }},
    {"memory_budget",
     [](const RunOptions& o) { return std::to_string(o.report.compare.memory_budget); },
     [](RunOptions& o, const std::string& v) {
       o.report.compare.memory_budget = std::stoull(v);
     }},
    {"threads", [](const RunOptions& o) { return std::to_string(o.report.compare.threads); },
     [](RunOptions& o, const std::string& v) { o.report.compare.threads = std::stoi(v); }},
    {"timeout", [](const RunOptions& o) { return num(o.timeout_seconds); },
     [](RunOptions& o, const std::string& v) { o.timeout_seconds = std::stod(v); }},
    {"chaos", [](const RunOptions& o) { return o.chaos; },
     [](RunOptions& o, const std::string& v) { o.chaos = v; }},
    {"reference_cache", [](const RunOptions& o) { return o.reference_cache.dir; },
     [](RunOptions& o, const std::string& v) { o.reference_cache.dir = v; }},
    {"reference_cache_bytes", [](const RunOptions& o) { return std::to_string(o.reference_cache.max_bytes); },
     [](RunOptions& o, const std::string& v) { o.reference_cache.max_bytes = std::stoull(v); }},
    {"no_reference", [](const RunOptions& o) { return std::string(o.no_reference ? "1" : "0"); },
     [](RunOptions& o, const std::string& v) { o.no_reference = v == "1"; }},
    {"profile", [](const RunOptions& o) { return std::string(o.profile ? "1" : "0"); },
     [](RunOptions& o, const std::string& v) { o.profile = v == "1"; }},
};

}  // namespace

// Rank 0's options (its command line and its DIFFCHECK_FLAGS) for every rank:
// ranks started with other arguments or another environment (an MPMD launch,
// a per-host environment) would otherwise validate differently, and the ones
// that passed would wait forever in their first collective for the others.
RunOptions agree_on_options(const Comm& world, RunOptions opts) {
  if (const char* env = std::getenv("DIFFCHECK_FLAGS")) {
    auto from_env = split_flag_list(env);
    opts.flags.insert(opts.flags.begin(), from_env.begin(), from_env.end());
  }
  if (world.rank() == 0 && !opts.scenario.empty() && opts.out.empty())
    opts.out = fmt::format("results/{}.h5", opts.scenario);
  const char sep = '\x1f';  // unit separator: in no option value
  std::string mine;
  for (const auto& f : fields) mine += fmt::format("{}={}{}", f.name, f.get(opts), sep);
  for (const auto& flag : opts.flags) mine += fmt::format("flag={}{}", flag, sep);
  const std::string agreed = world.broadcast_string(mine, 0);
  RunOptions out = opts;
  out.flags.clear();
  for (std::size_t at = 0; at < agreed.size();) {
    const auto end = agreed.find(sep, at);
    const std::string entry = agreed.substr(at, end - at);
    at = end + 1;
    const auto eq = entry.find('=');
    const std::string name = entry.substr(0, eq), value = entry.substr(eq + 1);
    if (name == "flag") {
      out.flags.push_back(value);
      continue;
    }
    for (const auto& f : fields)
      if (name == f.name) f.set(out, value);
  }
  return out;
}

}  // namespace dc
