#include "harness/run/run.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "harness/core/comm.h"
#include "harness/core/error.h"
#include "harness/core/flags.h"
#include "harness/run/scenario.h"
#include "harness/capture/store.h"

namespace dc {
namespace {

const Scenario& lookup(const std::string& name) {
  if (name.empty()) input_error("no scenario given: use --scenario NAME (see 'diffcheck list')");
  const Scenario* s = find_scenario(name);
  if (!s) {
    std::string known;
    for (const auto* x : all_scenarios()) known += (known.empty() ? "" : ", ") + x->name();
    input_error("unknown scenario '{}'; known scenarios: {}", name, known);
  }
  return *s;
}

void check_fault(const Scenario& s, const std::string& fault) {
  if (fault.empty()) return;
  std::string known;
  for (const auto& f : s.faults()) {
    if (f.name == fault) return;
    known += (known.empty() ? "" : ", ") + f.name;
  }
  input_error("unknown fault '{}' for scenario '{}'; its faults are: {}", fault, s.name(),
              known.empty() ? "(none)" : known);
}

void check_size(const Scenario& s, const std::string& size) {
  std::string known;
  for (const auto& z : s.sizes()) {
    if (z == size) return;
    known += (known.empty() ? "" : ", ") + z;
  }
  input_error("unknown size '{}' for scenario '{}'; its sizes are: {}", size, s.name(), known);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int run_scenario(const RunOptions& opts) {
  Comm world = Comm::world();
  const int rank = world.rank();

  // Everything below until the scenario runs is decided identically on every
  // rank, so a bad option ends every rank with the same InputError, no hang.
  const Scenario& scenario = lookup(opts.scenario);
  DType dtype = parse_dtype(opts.dtype);
  check_size(scenario, opts.size);
  Mesh mesh = Mesh::parse(opts.mesh.empty() ? scenario.default_mesh(world.size()) : opts.mesh);
  mesh.require_world(world.size());
  scenario.check_mesh(mesh, opts.size);
  std::vector<std::string> assignments;
  if (const char* env = std::getenv("DIFFCHECK_FLAGS")) assignments = split_flag_list(env);
  assignments.insert(assignments.end(), opts.flags.begin(), opts.flags.end());
  FlagValues flags = FlagValues::resolve(scenario.flags(), assignments, scenario.name());
  check_fault(scenario, opts.fault);
  std::string out = opts.out.empty() ? fmt::format("results/{}.h5", scenario.name()) : opts.out;

  spdlog::info("scenario {} mesh {} dtype {} flags [{}] fault '{}' -> {}", scenario.name(),
               mesh.str(), dtype_name(dtype), flags.str(), opts.fault, out);

  auto t0 = std::chrono::steady_clock::now();
  TapRecorder taps(mesh, rank, dtype);
  RunContext ctx{mesh, world, taps, flags, opts.fault, dtype, opts.seed, opts.size};
  scenario.run(ctx);
  const double ran = seconds_since(t0);
  spdlog::info("scenario ran in {:.3f}s ({:.3f}s of it references), {} taps", ran, taps.reference_seconds(),
               taps.records().size());
  // The sharded block's own time is the slowest rank's, references apart
  // (`diffcheck sweep` compares flags on it).
  const double sharded_s = world.max_double(ran - taps.reference_seconds());
  const double reference_s = world.max_double(taps.reference_seconds());

  if (rank == 0) {
    auto parent = std::filesystem::path(out).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  }
  auto t1 = std::chrono::steady_clock::now();
  RunInfo info{scenario.name(), flags.str() + (opts.fault.empty() ? "" : " inject=" + opts.fault),
               dtype_name(dtype), opts.seed, fmt::format("diffcheck {}", DIFFCHECK_VERSION)};
  write_run_file(world, out, info, taps);
  const double write_s = seconds_since(t1);
  spdlog::info("wrote {} in {:.3f}s", out, write_s);

  // Every rank reads the file back and checks its share of each tap's chunks:
  // the same path `diffcheck compare` takes (so a run and a later comparison
  // of its file cannot disagree), and rank 0 prints the report. The ranks
  // agree on errors, so a failure ends every rank alike.
  ReportOptions report = opts.report;
  report.compare.processes = &world;
  report.timings = {{"sharded_s", sharded_s}, {"reference_s", reference_s}, {"write_s", write_s}};
  int status = kExitPass;
  auto t2 = std::chrono::steady_clock::now();
  try {
    status = compare_and_report(out, "", report);
    spdlog::info("checked {} in {:.3f}s", out, seconds_since(t2));
  } catch (const std::exception& e) {
    fail("rank {}: comparison of '{}' failed: {}", rank, out, e.what());
  }
  return status;
}

}  // namespace dc
