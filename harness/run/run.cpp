#include "harness/run/run.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include <unistd.h>

#include "harness/capture/store.h"
#include "harness/core/agree.h"
#include "harness/core/comm.h"
#include "harness/core/error.h"
#include "harness/core/files.h"
#include "harness/core/flags.h"
#include "harness/core/interrupt.h"
#include "harness/core/memory.h"
#include "harness/core/work_counter.h"
#include "harness/core/progress.h"
#include "harness/core/watchdog.h"
#include "harness/run/agree_options.h"
#include "harness/run/calibrate.h"
#include "harness/run/chaos.h"
#include "harness/run/run_file.h"
#include "harness/run/check_run.h"
#include "harness/run/scenario.h"

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

double gemm_work() { return work::gemm_flops(false) + work::gemm_flops(true); }

}  // namespace

int run_scenario(const RunOptions& given) {
  Comm world = Comm::world();
  const int rank = world.rank();
  const RunOptions opts = agree_on_options(world, given);

  // Everything below until the scenario runs is decided identically on every
  // rank, so a bad option ends every rank with the same InputError, no hang.
  const Scenario& scenario = lookup(opts.scenario);
  DType dtype = parse_dtype(opts.dtype);
  check_size_and_pipeline(scenario, opts.size, opts.pipeline);
  Mesh mesh = Mesh::parse(opts.mesh.empty() ? scenario.default_mesh(world.size()) : opts.mesh);
  if (!opts.mesh.empty()) {
    const Mesh given = mesh;
    mesh = scenario.complete_mesh(given);
    if (mesh.str() != given.str() && world.rank() == 0)
      spdlog::info("--mesh {} taken as {} (unnamed axes have size 1)", given.str(), mesh.str());
  }
  mesh.require_world(world.size());
  scenario.check_mesh(mesh, opts.size);
  FlagValues flags = FlagValues::resolve(scenario.flags(), opts.flags, scenario.name());
  check_fault(scenario, opts.fault, opts.fault_scale);
  std::optional<ToleranceTable> file_table;
  if (!opts.tolerances_file.empty()) file_table = tolerance_file_table(world, opts, scenario, flags);
  if (opts.tolerance != "derived" && opts.tolerance != "calibrated")
    input_error("--tolerance takes derived or calibrated, not '{}'", opts.tolerance);
  if (opts.tolerance == "calibrated" && file_table)
    input_error("--tolerance calibrated and --tolerances FILE both say where tolerances come from: give one");
  Chaos chaos(opts.chaos, world.size());
  if (opts.timeout_seconds < 0) input_error("--timeout must be >= 0 (0: no watchdog)");
  const std::string out = opts.out;
  const bool one_host = announce_hosts(world);
  remove_run_file_when_stopped(out);
  const bool dir_shared = directory_shared(world, make_output_directories(out));
  refuse_store_unless_shared(out, opts.store, dir_shared);
  if (opts.store == "pwrite" && !one_host)
    input_error("--store pwrite needs every rank on one host (two hosts writing parts of one page through their own "
                "page caches can lose each other's bytes); use --store mpiio or auto");
  const std::uint64_t gather_max = gather_limit_bytes();
  auto watchdog =
      std::make_unique<Watchdog>(out + ".watch", rank, world.size(), opts.timeout_seconds, dir_shared);

  spdlog::info("scenario {} mesh {} dtype {} flags [{}] fault '{}' -> {}", scenario.name(),
               mesh.str(), dtype_name(dtype), flags.str(), opts.fault, out);

  GemmPeak peak;
  if (opts.profile && opts.measure_gemm_peak) {
    world.barrier();  // every rank at once: ranks that share cores share the peak
    peak = opts.measure_gemm_peak();
  }

  TapRecorder taps(mesh, rank, dtype);
  // References from the cache when an earlier run computed them (every rank
  // checks its own file; all agree on hit or miss). The boxes are read after
  // the scenario, into the memory it has freed (capture/reference_cache.h).
  const ReferenceCache cache(scenario.reference_cacheable(flags) ? opts.reference_cache : ReferenceCacheSettings{},
                             reference_key(scenario, opts, mesh, flags, dtype));
  const auto tl = std::chrono::steady_clock::now();
  DeferredBoxes cached_boxes;
  const ReferenceCacheOutcome cached = cache.load(world, taps, &cached_boxes);
  double load_s = seconds_since(tl);
  if (cached.hit) taps.set_references_cached(true);

  auto t0 = std::chrono::steady_clock::now();
  const double work0 = gemm_work(), work64_0 = work::gemm_flops(true);
  chaos.arm(taps, world, rank);
  const std::string inject =
      opts.fault.empty() ? "" : " inject=" + opts.fault + (opts.fault_scale == 1.0 ? "" : fmt::format("*{:g}", opts.fault_scale));
  const RunInfo info{scenario.name(), flags.str() + inject,
                     dtype_name(dtype), opts.seed, fmt::format("diffcheck {}", DIFFCHECK_VERSION), opts.size};
  // A scenario that says when its taps are all recorded has them written
  // beside its references (run_file.h).
  std::optional<PendingRunFile> begun;
  long long begun_bytes = 0;
  taps.on_all_taps_recorded([&] {
    if (auto b = begin_run_file_beside_references(world, out, info, taps, opts.store, dir_shared, one_host,
                                                  gather_max, begun_bytes))
      begun.emplace(std::move(*b));
  });
  RunContext ctx{mesh, world, taps, flags, opts.fault, dtype, opts.seed, opts.size, opts.pipeline, opts.fault_scale};
  interrupt::set_phase("running the scenario");
  double ran = 0;
  {
    const RetainFreedMemory keep_memory;  // the scenario's GB-sized temporaries reuse memory (core/memory.h)
    try {
      scenario.run(ctx);
    } catch (const InputError&) {
      throw;
    } catch (const Finding&) {
      throw;
    } catch (const std::exception& e) {
      // The code under test threw: a crash of this rank, and a finding.
      throw Finding(fmt::format("CRASH on rank {}: exception in scenario {}: {}; {}", rank,
                                scenario.name(), e.what(), where_now()),
                    false);
    }
    ran = seconds_since(t0);
    if (cached.hit) {
      const auto tb = std::chrono::steady_clock::now();
      agreed_on_all(world, [&] {
        cached_boxes.read_into(rank, taps);
        return std::string();
      });
      load_s += seconds_since(tb);
    }
  }
  double load_bytes = 0;
  if (cached.hit) {
    for (const auto& [name, part] : taps.references())
      for (const auto& b : part.blocks) load_bytes += double(b.data.size() * sizeof(double));
    if (rank == 0)
      spdlog::info("references of {} taps read from the reference cache {} in {:.3f}s", taps.references().size(),
                   cache.entry_dir(), load_s);
  }
  chaos.warn_if_unused(rank);
  const double run_work = gemm_work() - work0, run_work64 = work::gemm_flops(true) - work64_0;
  // A computed reference goes to the cache on a thread of its own (no MPI),
  // beside the run file's write and the check; joined before the run ends.
  std::jthread storing;
  if (cache.settings().enabled() && !cached.hit && !interrupt::stopping())
    storing = std::jthread([&cache, &taps, rank] { cache.store(rank, taps); });
  spdlog::info("scenario ran in {:.3f}s ({:.3f}s of it references), {} taps", ran,
               taps.reference_seconds(), taps.records().size());
  // The sharded block's own time is the slowest rank's, references apart
  // (`diffcheck sweep` compares flags on it).
  const double sharded_s = world.max_double(ran - taps.reference_seconds());
  const double reference_s = world.max_double(taps.reference_seconds());

  interrupt::set_phase("writing the run file");
  auto t1 = std::chrono::steady_clock::now();
  const long long file_bytes = bytes_to_write(world, taps);
  require_room_for_run_file(world, out, file_bytes - begun_bytes);  // the taps of a begun file have theirs
  const WriteMode write_mode =
      begun ? WriteMode::positional : choose_write_mode(world, opts.store, dir_shared, one_host, file_bytes, gather_max);
  // A small file rank 0 has written is checked there, from the file; else
  // the ranks check the taps where they are, in memory (run/check_run.h),
  // and a file the ranks write at their offsets goes out beside the check.
  // Rank 0 prints the report; the ranks agree on errors, so a failure ends
  // every rank alike.
  const CheckPlace check_place = write_mode == WriteMode::gathered && static_cast<std::uint64_t>(file_bytes) <= gather_max
                                     ? CheckPlace::rank0_file
                                     : CheckPlace::in_memory;
  PendingRunFile run_file = start_run_file(world, out, info, taps, write_mode,
                                           [&] { chaos.during("write", world, rank); }, begun ? &*begun : nullptr);
  const bool write_beside_check = write_mode == WriteMode::positional;  // always checked in memory
  if (!write_beside_check) run_file.finish();
  double write_s = seconds_since(t1);
  if (!write_beside_check) spdlog::info("wrote {} in {:.3f}s", out, write_s);
  ReportOptions report = opts.report;
  report.timings = {{"sharded_s", sharded_s}, {"reference_s", reference_s}, {"write_s", write_s}};
  if (cache.settings().enabled()) report.reference_source = cached.summary();
  // The profile: the sharded block's work is all float32 (bfloat16 is
  // emulated in float), the references' all float64.
  const double ref_work = taps.reference_flops();
  std::vector<Phase> phases{
      {"sharded", ran - taps.reference_seconds(), run_work - run_work64, run_work64 - ref_work, 0, ""},
      {"references", cached.hit ? load_s : taps.reference_seconds() + load_s, 0, cached.hit ? 0 : ref_work, load_bytes,
       cached.hit ? "read from the reference cache" : (cache.settings().enabled() ? "computed; cached" : "computed")},
      {"write", write_s, 0, 0, write_beside_check ? 0 : run_file_bytes(rank, out), "run file"}};
  RunProfile profile;  // beside the check: combined once the write is done (below)
  if (!write_beside_check) {
    profile = combine_profile(world, phases, peak);
    if (opts.profile) report.profile = profile_numbers(profile);
  }
  // Written beside the check: finished once the verdict is known, before it
  // is reported, so the report has the write's figures and the file is in
  // place. A failed write ends the run (exit 2) with nothing reported.
  bool write_failed = false;
  double write_waited_s = 0;
  if (write_beside_check)
    report.before_report = [&](std::vector<std::pair<std::string, double>>& timings,
                               std::vector<std::pair<std::string, double>>& profile_numbers_out) {
      const auto tw = std::chrono::steady_clock::now();
      try {
        run_file.finish();
      } catch (const std::exception&) {
        write_failed = true;
        throw;
      }
      write_waited_s = seconds_since(tw);
      write_s += run_file.background_seconds();
      spdlog::info("wrote {} in {:.3f}s, beside the check ({:.3f}s waited for after it)", out, write_s, write_waited_s);
      phases.back() = {"write", write_s, 0, 0, run_file_bytes(rank, out),
                       begun_bytes ? "run file: taps beside the references, the rest beside the check"
                                   : "run file, written beside the check",
                       true};
      profile = combine_profile(world, phases, peak);
      for (auto& [name, value] : timings)
        if (name == "write_s") value = profile.phases.back().seconds;
      if (opts.profile) profile_numbers_out = profile_numbers(profile);
    };
  std::optional<ToleranceTable> calibrated;
  if (opts.tolerance == "calibrated") {
    interrupt::set_phase("calibrating the tolerances");
    const auto tc = std::chrono::steady_clock::now();
    const NoiseFloorRequest req{&scenario, dtype,         opts.seed,           opts.size,
                                flags,     opts.pipeline, opts.calibration_runs, opts.reference_cache};
    bool from_cache = false;
    const ToleranceFile measured{calibration_info(req), measure_noise_floors(world, req, &from_cache)};
    calibrated = tolerance_table(measured, ToleranceSource::calibrated,
                                 fmt::format("calibrated {}({} one-device runs)",
                                             from_cache ? "earlier, read from the reference cache " : "in this run ",
                                             opts.calibration_runs),
                                 /*same_inputs=*/true);
    report.timings.emplace_back("calibrate_s", seconds_since(tc));
    spdlog::info("calibrated the tolerances of {} taps in {:.3f}s", calibrated->taps.size(), seconds_since(tc));
  }
  if (file_table) report.compare.tolerances = &*file_table;
  if (calibrated) report.compare.tolerances = &*calibrated;
  report.junit_name = fmt::format("{} mesh {} {}{}{}", scenario.name(), mesh.str(), dtype_name(dtype),
                                  flags.str().empty() ? "" : " " + flags.str(),
                                  inject);
  int status = kExitPass;
  interrupt::set_phase("checking the taps");
  chaos.during("check", world, rank);
  auto t2 = std::chrono::steady_clock::now();
  try {
    status = check_run(world, taps, info, out, check_place, report, t2);
    spdlog::info("checked {} in {:.3f}s", out, seconds_since(t2));
    RunProfile whole = profile;
    whole.phases.push_back({"check", world.max_double(seconds_since(t2)), 0, 0, 0,
                            write_beside_check ? fmt::format("{:.3f}s of it waiting for the write", write_waited_s) : ""});
    if (rank == 0) {
      const std::string table = profile_table(whole);
      if (opts.profile) std::fputs(table.c_str(), stdout), std::fflush(stdout);
      spdlog::info("{}", table);
    }
  } catch (const std::exception& e) {
    if (write_failed) throw;  // its message names the run file
    fail("rank {}: comparison of '{}' failed: {}", rank, out, e.what());
  }
  interrupt::verdict_reached();
  interrupt::set_phase("finishing");
  if (storing.joinable()) storing.join();
  watchdog.reset();
  world.barrier();
  if (rank == 0 && cache.settings().enabled() && !cached.hit) cache.evict();  // every rank's file is in
  // Every rank's file is gone; on hosts that do not share the directory each
  // has its own (empty) watch directory to remove.
  std::error_code ec;
  std::filesystem::remove(out + ".watch", ec);
  return status;
}

}  // namespace dc
