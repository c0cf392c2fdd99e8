// What a scenario run settles before it runs, identically on every rank:
// the scenario, its fault, the tolerance file, the hosts, and the key of its
// references in the cache.
#include "harness/run/run_setup.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include <unistd.h>

#include "harness/core/agree.h"
#include "harness/core/error.h"
#include "harness/core/files.h"
#include "harness/core/interrupt.h"
#include "harness/core/progress.h"

namespace dc {


const Scenario& lookup_scenario(const std::string& name) {
  if (name.empty()) input_error("no scenario given: use --scenario NAME (see 'diffcheck list')");
  const Scenario* s = find_scenario(name);
  if (!s) {
    std::string known;
    for (const auto* x : all_scenarios()) known += (known.empty() ? "" : ", ") + x->name();
    input_error("unknown scenario '{}'; known scenarios: {}", name, known);
  }
  return *s;
}

void check_fault(const Scenario& s, const std::string& fault, double scale) {
  if (!(scale >= 0) || !std::isfinite(scale)) input_error("--fault-scale must be a finite number >= 0");
  if (fault.empty()) {
    if (scale != 1.0) input_error("--fault-scale {} without --inject: it scales the injected fault", scale);
    return;
  }
  std::string known;
  for (const auto& f : s.faults()) {
    if (f.name == fault) {
      if (scale != 1.0 && f.scale_help.empty()) {
        std::string scalable;
        for (const auto& g : s.faults())
          if (!g.scale_help.empty()) scalable += (scalable.empty() ? "" : ", ") + g.name;
        input_error("fault '{}' of {} has no size to scale (--fault-scale); its faults of continuous size: {}", fault,
                    s.name(), scalable.empty() ? "(none)" : scalable);
      }
      return;
    }
    known += (known.empty() ? "" : ", ") + f.name;
  }
  input_error("unknown fault '{}' for scenario '{}'; its faults are: {}", fault, s.name(),
              known.empty() ? "(none)" : known);
}


std::string where_now() {
  auto s = progress::snapshot();
  return fmt::format(
      "last collective {}; last tap {}",
      s.collective ? fmt::format("#{} {} on '{}'", s.collective, s.op, s.group) : "none yet",
      s.tap.empty() ? "none yet" : "'" + s.tap + "'");
}

// Which ranks run on which host, for the line rank 0 prints when the launcher
// ends the job (a lost host): one hostname per rank, gathered once. True
// when every rank runs on one host.
bool announce_hosts(const Comm& world) {
  char name[256] = "";
  gethostname(name, sizeof name - 1);
  const auto hosts = world.all_gather_strings(name);
  const bool one_host = std::all_of(hosts.begin(), hosts.end(), [&](const auto& h) { return h == hosts[0]; });
  if (world.rank() != 0) return one_host;
  std::vector<std::pair<std::string, std::vector<int>>> by_host;  // in order of first rank
  for (int r = 0; r < world.size(); ++r) {
    const auto& h = hosts[static_cast<std::size_t>(r)];
    auto it = std::find_if(by_host.begin(), by_host.end(), [&](const auto& e) { return e.first == h; });
    if (it == by_host.end()) by_host.push_back({h, {}}), it = by_host.end() - 1;
    it->second.push_back(r);
  }
  std::string text;
  for (const auto& [h, ranks] : by_host) {
    std::string list;
    for (std::size_t i = 0; i < ranks.size();) {
      std::size_t j = i;
      while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
      list += fmt::format("{}{}", list.empty() ? "" : ",",
                          i == j ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]));
      i = j + 1;
    }
    text += fmt::format("{}{}: {}", text.empty() ? "" : "; ", h, list);
  }
  if (by_host.size() > 1) spdlog::info("ranks by host: {}", text);
  interrupt::set_rank_hosts(text);
  return one_host;
}

// The table of --tolerances FILE: rank 0 reads the file and every rank parses
// the same text, so all agree on it (or on the error) whatever hosts see.
ToleranceTable tolerance_file_table(const Comm& world, const RunOptions& opts, const Scenario& scenario,
                                    const FlagValues& flags) {
  const std::string text = agreed_on_root(world, 0, [&] {
    try {
      return read_text_file(opts.tolerances_file, "tolerance file");
    } catch (const std::exception& e) {
      throw InputError(e.what());
    }
  });
  const ToleranceFile f = parse_tolerance_file(text, opts.tolerances_file);
  require_matching_file(f, opts.tolerances_file, scenario.name(), opts.size, opts.dtype);
  const bool same = same_inputs_as(f.info, opts.seed, flags.str(), opts.pipeline.steps, opts.pipeline.reference_mode);
  if (same && world.rank() == 0)
    spdlog::info("tolerance file {} was calibrated on this run's seed and flags: its rel L2 limits are at most {} x "
                 "the unperturbed one-device error", opts.tolerances_file, f.info.k_same_inputs);
  return tolerance_table(f, ToleranceSource::file, opts.tolerances_file, same);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Everything a run's references depend on, for the reference cache's key
// (the cache adds the build): not the fault, its scale, the tolerances or
// where the run file goes. The mesh is in it because each rank keeps the
// reference boxes it computed, and which boxes those are follows the mesh.
std::string reference_key(const Scenario& s, const RunOptions& o, const Mesh& mesh, const FlagValues& flags,
                          DType dtype) {
  return fmt::format("scenario {}\nsize {}\nseed {}\ndtype {}\nmesh {}\nflags {}\npipeline steps={} reference_mode={} "
                     "tap_blocks={}\n",
                     s.name(), o.size, o.seed, dtype_name(dtype), mesh.str(), flags.str(), o.pipeline.steps,
                     o.pipeline.reference_mode, o.pipeline.tap_blocks);
}

}  // namespace dc
