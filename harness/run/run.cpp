#include "harness/run/run.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <csignal>
#include <thread>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>

#include "harness/core/comm.h"
#include "harness/core/error.h"
#include "harness/core/flags.h"
#include "harness/core/progress.h"
#include "harness/core/watchdog.h"
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

// Rank 0's options (its command line and its DIFFCHECK_FLAGS) for every rank:
// ranks started with other arguments or another environment (an MPMD launch,
// a per-host environment) would otherwise validate differently, and the ones
// that passed would wait forever in their first collective for the others.
RunOptions agree_on_options(const Comm& world, RunOptions opts) {
  if (const char* env = std::getenv("DIFFCHECK_FLAGS")) {
    auto from_env = split_flag_list(env);
    opts.flags.insert(opts.flags.begin(), from_env.begin(), from_env.end());
  }
  if (world.rank() == 0 && !opts.scenario.empty()) {
    // The run file's directory, and beside the file the watchdog's directory,
    // exist before any rank looks for them (the broadcast below orders it).
    if (opts.out.empty()) opts.out = fmt::format("results/{}.h5", opts.scenario);
    std::error_code ec;
    auto parent = std::filesystem::path(opts.out).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    std::filesystem::create_directories(opts.out + ".watch", ec);
  }
  const char sep = '\x1f';
  std::string mine;
  auto put = [&](const std::string& s) { mine += s + sep; };
  auto put_opt = [&](const std::optional<double>& v) { put(v ? fmt::format("{:.17g}", *v) : ""); };
  const auto& c = opts.report.compare;
  put(opts.scenario), put(opts.mesh), put(opts.dtype), put(std::to_string(opts.seed)), put(opts.fault);
  put(opts.size), put(opts.out), put(opts.report.json_path), put_opt(c.atol), put_opt(c.rtol);
  put(std::to_string(c.replica_ulps)), put(std::to_string(c.memory_budget)), put(std::to_string(c.threads));
  put(fmt::format("{:.17g}", opts.timeout_seconds)), put(opts.chaos);
  for (const auto& f : opts.flags) put(f);
  const std::string agreed = world.broadcast_string(mine, 0);
  std::vector<std::string> v;
  for (std::size_t at = 0; at < agreed.size();) {
    auto end = agreed.find(sep, at);
    v.push_back(agreed.substr(at, end - at));
    at = end + 1;
  }
  auto opt = [](const std::string& s) { return s.empty() ? std::optional<double>{} : std::optional<double>{std::stod(s)}; };
  RunOptions out = opts;
  out.scenario = v[0], out.mesh = v[1], out.dtype = v[2], out.seed = std::stoull(v[3]), out.fault = v[4];
  out.size = v[5], out.out = v[6], out.report.json_path = v[7];
  out.report.compare.atol = opt(v[8]), out.report.compare.rtol = opt(v[9]);
  out.report.compare.replica_ulps = std::stol(v[10]);
  out.report.compare.memory_budget = std::stoull(v[11]);
  out.report.compare.threads = std::stoi(v[12]);
  out.timeout_seconds = std::stod(v[13]);
  out.chaos = v[14];
  out.flags.assign(v.begin() + 15, v.end());
  return out;
}

struct Chaos {
  enum class Kind { none, crash, hang, desync } kind = Kind::none;
  int rank = -1;
  std::string after;  // empty: the first tap
};

Chaos parse_chaos(const std::string& s, int world) {
  Chaos c;
  if (s.empty()) return c;
  auto at = s.find('@');
  auto usage = [&] {
    input_error("--chaos '{}': expected crash@RANK, hang@RANK or desync@RANK, optionally :after=TAP (RANK < {})", s,
                world);
  };
  if (at == std::string::npos) usage();
  const std::string kind = s.substr(0, at);
  std::string rest = s.substr(at + 1);
  if (auto colon = rest.find(':'); colon != std::string::npos) {
    if (rest.compare(colon + 1, 6, "after=") != 0 || rest.size() == colon + 7) usage();
    c.after = rest.substr(colon + 7);
    rest = rest.substr(0, colon);
  }
  c.kind = kind == "crash" ? Chaos::Kind::crash : kind == "hang" ? Chaos::Kind::hang
         : kind == "desync" ? Chaos::Kind::desync : Chaos::Kind::none;
  if (c.kind == Chaos::Kind::none || rest.empty() || rest.find_first_not_of("0123456789") != std::string::npos) usage();
  c.rank = std::stoi(rest);
  if (c.rank >= world) usage();
  return c;
}

std::string where_now() {
  auto s = progress::snapshot();
  return fmt::format("last collective {}; last tap {}",
                     s.collective ? fmt::format("#{} {} on '{}'", s.collective, s.op, s.group) : "none yet",
                     s.tap.empty() ? "none yet" : "'" + s.tap + "'");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int run_scenario(const RunOptions& given) {
  Comm world = Comm::world();
  const int rank = world.rank();
  const RunOptions opts = agree_on_options(world, given);

  // Everything below until the scenario runs is decided identically on every
  // rank, so a bad option ends every rank with the same InputError, no hang.
  const Scenario& scenario = lookup(opts.scenario);
  DType dtype = parse_dtype(opts.dtype);
  check_size(scenario, opts.size);
  Mesh mesh = Mesh::parse(opts.mesh.empty() ? scenario.default_mesh(world.size()) : opts.mesh);
  mesh.require_world(world.size());
  scenario.check_mesh(mesh, opts.size);
  FlagValues flags = FlagValues::resolve(scenario.flags(), opts.flags, scenario.name());
  check_fault(scenario, opts.fault);
  const Chaos chaos = parse_chaos(opts.chaos, world.size());
  if (opts.timeout_seconds < 0) input_error("--timeout must be >= 0 (0: no watchdog)");
  const std::string out = opts.out;
  auto watchdog = std::make_unique<Watchdog>(out + ".watch", rank, world.size(), opts.timeout_seconds);

  spdlog::info("scenario {} mesh {} dtype {} flags [{}] fault '{}' -> {}", scenario.name(),
               mesh.str(), dtype_name(dtype), flags.str(), opts.fault, out);

  auto t0 = std::chrono::steady_clock::now();
  TapRecorder taps(mesh, rank, dtype);
  bool chaos_done = false;
  if (chaos.rank == rank)
    taps.on_tap([&](const std::string& name) {
      if (chaos_done || (!chaos.after.empty() && name != chaos.after)) return;
      chaos_done = true;
      spdlog::warn("--chaos: {} after tap '{}'", opts.chaos, name);
      if (chaos.kind == Chaos::Kind::crash) std::raise(SIGSEGV);
      if (chaos.kind == Chaos::Kind::hang)
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      if (chaos.kind == Chaos::Kind::desync) world.barrier();  // a collective nobody else calls
    });
  RunContext ctx{mesh, world, taps, flags, opts.fault, dtype, opts.seed, opts.size};
  try {
    scenario.run(ctx);
  } catch (const InputError&) {
    throw;
  } catch (const Finding&) {
    throw;
  } catch (const std::exception& e) {
    // The code under test threw: a crash of this rank, and a finding.
    throw Finding(fmt::format("CRASH on rank {}: exception in scenario {}: {}; {}", rank, scenario.name(), e.what(),
                              where_now()),
                  false);
  }
  if (chaos.rank == rank && !chaos_done)
    spdlog::warn("--chaos {}: rank {} never recorded tap '{}'; nothing was injected", opts.chaos, rank, chaos.after);
  const double ran = seconds_since(t0);
  spdlog::info("scenario ran in {:.3f}s ({:.3f}s of it references), {} taps", ran, taps.reference_seconds(),
               taps.records().size());
  // The sharded block's own time is the slowest rank's, references apart
  // (`diffcheck sweep` compares flags on it).
  const double sharded_s = world.max_double(ran - taps.reference_seconds());
  const double reference_s = world.max_double(taps.reference_seconds());

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
  watchdog.reset();
  world.barrier();
  if (rank == 0) {
    std::error_code ec;
    std::filesystem::remove_all(out + ".watch", ec);
  }
  return status;
}

}  // namespace dc
