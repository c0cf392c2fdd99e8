// A scenario run, phase by phase: settle the options (identically on every
// rank), run the sharded block and its references (or read them from the
// cache), write the run file, calibrate the tolerances when asked, check the
// taps and report, and finish.
#include "harness/run/run.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "harness/capture/store.h"
#include "harness/core/agree.h"
#include "harness/core/comm.h"
#include "harness/core/error.h"
#include "harness/core/files.h"
#include "harness/core/interrupt.h"
#include "harness/core/memory.h"
#include "harness/core/watchdog.h"
#include "harness/core/work_counter.h"
#include "harness/run/agree_options.h"
#include "harness/run/calibrate.h"
#include "harness/run/chaos.h"
#include "harness/run/check_run.h"
#include "harness/run/run_file.h"
#include "harness/run/run_setup.h"
#include "harness/run/scenario.h"

namespace dc {
namespace {

double gemm_work() { return work::gemm_flops(false) + work::gemm_flops(true); }

// The mesh of the options (the scenario's default for the world size, or
// --mesh with unnamed axes of size 1), checked against the world and the
// size (itself checked first).
Mesh settle_mesh(const Comm& world, const Scenario& scenario, const RunOptions& opts) {
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
  return mesh;
}

class ScenarioRun {
 public:
  ScenarioRun(Comm world, const RunOptions& given)
      : world_(world),
        rank_(world.rank()),
        opts_(agree_on_options(world, given)),
        scenario_(lookup_scenario(opts_.scenario)),
        dtype_(parse_dtype(opts_.dtype)),
        mesh_(settle_mesh(world, scenario_, opts_)),
        flags_(FlagValues::resolve(scenario_.flags(), opts_.flags, scenario_.name())),
        chaos_(settle_tolerances_then_chaos()),
        out_(opts_.out),
        taps_(mesh_, rank_, dtype_),
        cache_(scenario_.reference_cacheable(flags_) && !opts_.no_reference ? opts_.reference_cache : ReferenceCacheSettings{},
               reference_key(scenario_, opts_, mesh_, flags_, dtype_)) {}

  int operator()() {
    prepare_output();
    run_block();
    write_run_file();
    calibrate();
    const int status = check();
    finish();
    return status;
  }

 private:
  // The fault and where the tolerances come from, then the --chaos fault
  // (in this order, as a user's errors are reported).
  Chaos settle_tolerances_then_chaos() {
    check_fault(scenario_, opts_.fault, opts_.fault_scale);
    if (!opts_.tolerances_file.empty()) file_table_ = tolerance_file_table(world_, opts_, scenario_, flags_);
    if (opts_.tolerance != "derived" && opts_.tolerance != "calibrated")
      input_error("--tolerance takes derived or calibrated, not '{}'", opts_.tolerance);
    if (opts_.tolerance == "calibrated" && file_table_)
      input_error("--tolerance calibrated and --tolerances FILE both say where tolerances come from: give one");
    if (opts_.no_reference) refuse_what_needs_a_reference();
    return Chaos(opts_.chaos, world_.size());
  }

  // --no-reference: what only a reference gives is refused, naming why.
  void refuse_what_needs_a_reference() const {
    if (opts_.tolerance == "calibrated")
      input_error("--no-reference with --tolerance calibrated: the calibration measures noise against a one-device "
                  "run; compare runs with `diffcheck compare RUN --against OTHER` (tolerances from `diffcheck "
                  "calibrate` with --tolerances, or the derived rule)");
    if (scenario_.is_pipeline() && opts_.pipeline.reference_mode != "free")
      input_error("--no-reference: scenario {} in --reference-mode forced starts each step from the reference's "
                  "latents; give --reference-mode free (each run follows its own trajectory)",
                  scenario_.name());
  }

  // The output directory, the store it allows, the watchdog, the GEMM peak.
  void prepare_output() {
    if (opts_.timeout_seconds < 0) input_error("--timeout must be >= 0 (0: no watchdog)");
    one_host_ = announce_hosts(world_);
    remove_run_file_when_stopped(out_);
    dir_shared_ = directory_shared(world_, make_output_directories(out_));
    refuse_store_unless_shared(out_, opts_.store, dir_shared_);
    if (opts_.store == "pwrite" && !one_host_)
      input_error("--store pwrite needs every rank on one host (two hosts writing parts of one page through their own "
                  "page caches can lose each other's bytes); use --store mpiio or auto");
    gather_max_ = gather_limit_bytes();
    watchdog_ = std::make_unique<Watchdog>(out_ + ".watch", rank_, world_.size(), opts_.timeout_seconds, dir_shared_);
    spdlog::info("scenario {} mesh {} dtype {} flags [{}] fault '{}' -> {}", scenario_.name(), mesh_.str(),
                 dtype_name(dtype_), flags_.str(), opts_.fault, out_);
    if (opts_.profile && opts_.measure_gemm_peak) {
      world_.barrier();  // every rank at once: ranks that share cores share the peak
      peak_ = opts_.measure_gemm_peak();
    }
  }

  // The scenario itself; an exception of the code under test is a crash of
  // this rank, and a finding.
  void run_scenario_code() {
    RunContext ctx{mesh_, world_, taps_, flags_, opts_.fault, dtype_, opts_.seed, opts_.size, opts_.pipeline,
                   opts_.fault_scale};
    try {
      scenario_.run(ctx);
    } catch (const InputError&) {
      throw;
    } catch (const Finding&) {
      throw;
    } catch (const std::exception& e) {
      throw Finding(fmt::format("CRASH on rank {}: exception in scenario {}: {}; {}", rank_, scenario_.name(),
                                e.what(), where_now()),
                    false);
    }
  }

  // The sharded block and its references. References come from the cache
  // when an earlier run computed them (every rank checks its own file; all
  // agree on hit or miss); the boxes are read after the scenario, into the
  // memory it has freed (capture/reference_cache.h).
  void run_block() {
    const auto tl = std::chrono::steady_clock::now();
    DeferredBoxes cached_boxes;
    cached_ = cache_.load(world_, taps_, &cached_boxes);
    load_s_ = seconds_since(tl);
    if (cached_.hit) taps_.set_references_cached(true);
    if (opts_.no_reference) taps_.set_no_reference();
    const auto t0 = std::chrono::steady_clock::now();
    const double work0 = gemm_work(), work64_0 = work::gemm_flops(true);
    chaos_.arm(taps_, world_, rank_);
    inject_ = opts_.fault.empty() ? ""
                                  : " inject=" + opts_.fault +
                                        (opts_.fault_scale == 1.0 ? "" : fmt::format("*{:g}", opts_.fault_scale));
    info_ = RunInfo{scenario_.name(), flags_.str() + inject_, dtype_name(dtype_), opts_.seed,
                    fmt::format("diffcheck {}", DIFFCHECK_VERSION), opts_.size};
    // A scenario that says when its taps are all recorded has them written
    // beside its references (run_file.h).
    taps_.on_all_taps_recorded([this] {
      if (auto b = begin_run_file_beside_references(world_, out_, info_, taps_, opts_.store, dir_shared_, one_host_,
                                                    gather_max_, begun_bytes_))
        begun_.emplace(std::move(*b));
    });
    interrupt::set_phase("running the scenario");
    {
      const RetainFreedMemory keep_memory;  // the scenario's GB-sized temporaries reuse memory (core/memory.h)
      run_scenario_code();
      ran_ = seconds_since(t0);
      if (cached_.hit) {
        const auto tb = std::chrono::steady_clock::now();
        agreed_on_all(world_, [&] {
          cached_boxes.read_into(rank_, taps_);
          return std::string();
        });
        load_s_ += seconds_since(tb);
      }
    }
    after_block(gemm_work() - work0, work::gemm_flops(true) - work64_0);
  }

  // The block's figures, and a computed reference sent to the cache on a
  // thread of its own (no MPI), beside the run file's write and the check;
  // joined before the run ends.
  void after_block(double run_work, double run_work64) {
    double load_bytes = 0;
    if (cached_.hit) {
      for (const auto& [name, part] : taps_.references())
        for (const auto& b : part.blocks) load_bytes += double(b.data.size() * sizeof(double));
      if (rank_ == 0)
        spdlog::info("references of {} taps read from the reference cache {} in {:.3f}s", taps_.references().size(),
                     cache_.entry_dir(), load_s_);
    }
    chaos_.warn_if_unused(rank_);
    if (cache_.settings().enabled() && !cached_.hit && !interrupt::stopping())
      storing_ = std::jthread([this] { cache_.store(rank_, taps_); });
    spdlog::info("scenario ran in {:.3f}s ({:.3f}s of it references), {} taps", ran_, taps_.reference_seconds(),
                 taps_.records().size());
    // The sharded block's own time is the slowest rank's, references apart
    // (`diffcheck sweep` compares flags on it). The profile: the sharded
    // block's work is all float32 (bfloat16 is emulated in float), the
    // references' all float64.
    sharded_s_ = world_.max_double(ran_ - taps_.reference_seconds());
    reference_s_ = world_.max_double(taps_.reference_seconds());
    const double ref_work = taps_.reference_flops();
    phases_ = {{"sharded", ran_ - taps_.reference_seconds(), run_work - run_work64, run_work64 - ref_work, 0, ""},
               {"references", cached_.hit ? load_s_ : taps_.reference_seconds() + load_s_, 0,
                cached_.hit ? 0 : ref_work, load_bytes,
                cached_.hit ? "read from the reference cache"
                            : (cache_.settings().enabled() ? "computed; cached" : "computed")}};
  }

  // The run file. A small file rank 0 has written is checked there, from the
  // file; else the ranks check the taps where they are, in memory
  // (run/check_run.h), and a file the ranks write at their offsets goes out
  // beside the check. Rank 0 prints the report; the ranks agree on errors,
  // so a failure ends every rank alike.
  void write_run_file() {
    interrupt::set_phase("writing the run file");
    const auto t1 = std::chrono::steady_clock::now();
    const long long file_bytes = bytes_to_write(world_, taps_);
    require_room_for_run_file(world_, out_, file_bytes - begun_bytes_);  // the taps of a begun file have theirs
    const WriteMode write_mode = begun_ ? WriteMode::positional
                                        : choose_write_mode(world_, opts_.store, dir_shared_, one_host_, file_bytes,
                                                            gather_max_);
    check_place_ = write_mode == WriteMode::gathered && static_cast<std::uint64_t>(file_bytes) <= gather_max_
                       ? CheckPlace::rank0_file
                       : CheckPlace::in_memory;
    run_file_.emplace(start_run_file(world_, out_, info_, taps_, write_mode,
                                     [this] { chaos_.during("write", world_, rank_); }, begun_ ? &*begun_ : nullptr));
    write_beside_check_ = write_mode == WriteMode::positional;  // always checked in memory
    if (!write_beside_check_) run_file_->finish();
    write_s_ = seconds_since(t1);
    if (!write_beside_check_) spdlog::info("wrote {} in {:.3f}s", out_, write_s_);
    report_ = opts_.report;
    report_.timings = {{"sharded_s", sharded_s_}, {"reference_s", reference_s_}, {"write_s", write_s_}};
    if (cache_.settings().enabled()) report_.reference_source = cached_.summary();
    if (opts_.no_reference)
      report_.reference_source = fmt::format(
          "no reference (--no-reference): each tap's own checks only; compare this run with another run of the same "
          "computation: diffcheck compare {} --against OTHER_RUN",
          out_);
    phases_.push_back({"write", write_s_, 0, 0, write_beside_check_ ? 0 : run_file_bytes(rank_, out_), "run file"});
    if (!write_beside_check_) {
      profile_ = combine_profile(world_, phases_, peak_);  // beside the check: once the write is done
      if (opts_.profile) report_.profile = profile_numbers(profile_);
    } else {
      report_.before_report = [this](auto& timings, auto& numbers) { finish_write_beside_check(timings, numbers); };
    }
  }

  // Written beside the check: finished once the verdict is known, before it
  // is reported, so the report has the write's figures and the file is in
  // place. A failed write ends the run (exit 2) with nothing reported.
  void finish_write_beside_check(std::vector<std::pair<std::string, double>>& timings,
                                 std::vector<std::pair<std::string, double>>& profile_numbers_out) {
    const auto tw = std::chrono::steady_clock::now();
    try {
      run_file_->finish();
    } catch (const std::exception&) {
      write_failed_ = true;
      throw;
    }
    write_waited_s_ = seconds_since(tw);
    write_s_ += run_file_->background_seconds();
    spdlog::info("wrote {} in {:.3f}s, beside the check ({:.3f}s waited for after it)", out_, write_s_,
                 write_waited_s_);
    phases_.back() = {"write", write_s_, 0, 0, run_file_bytes(rank_, out_),
                      begun_bytes_ ? "run file: taps beside the references, the rest beside the check"
                                   : "run file, written beside the check",
                      true};
    profile_ = combine_profile(world_, phases_, peak_);
    for (auto& [name, value] : timings)
      if (name == "write_s") value = profile_.phases.back().seconds;
    if (opts_.profile) profile_numbers_out = profile_numbers(profile_);
  }

  // --tolerance calibrated: the noise floors measured within the run.
  void calibrate() {
    if (opts_.tolerance == "calibrated") {
      interrupt::set_phase("calibrating the tolerances");
      const auto tc = std::chrono::steady_clock::now();
      const NoiseFloorRequest req{&scenario_, dtype_,         opts_.seed,           opts_.size,
                                  flags_,     opts_.pipeline, opts_.calibration_runs, opts_.reference_cache};
      bool from_cache = false;
      const ToleranceFile measured{calibration_info(req), measure_noise_floors(world_, req, &from_cache)};
      calibrated_ = tolerance_table(measured, ToleranceSource::calibrated,
                                    fmt::format("calibrated {}({} one-device runs)",
                                                from_cache ? "earlier, read from the reference cache " : "in this run ",
                                                opts_.calibration_runs),
                                    /*same_inputs=*/true);
      report_.timings.emplace_back("calibrate_s", seconds_since(tc));
      spdlog::info("calibrated the tolerances of {} taps in {:.3f}s", calibrated_->taps.size(), seconds_since(tc));
    }
    if (file_table_) report_.compare.tolerances = &*file_table_;
    if (calibrated_) report_.compare.tolerances = &*calibrated_;
    report_.junit_name = fmt::format("{} mesh {} {}{}{}", scenario_.name(), mesh_.str(), dtype_name(dtype_),
                                     flags_.str().empty() ? "" : " " + flags_.str(), inject_);
  }

  // The check and its report (rank 0), then the profile with the check in it.
  int check() {
    int status = kExitPass;
    interrupt::set_phase("checking the taps");
    chaos_.during("check", world_, rank_);
    const auto t2 = std::chrono::steady_clock::now();
    try {
      status = check_run(world_, taps_, info_, out_, check_place_, report_, t2);
      spdlog::info("checked {} in {:.3f}s", out_, seconds_since(t2));
      RunProfile whole = profile_;
      whole.phases.push_back(
          {"check", world_.max_double(seconds_since(t2)), 0, 0, 0,
           write_beside_check_ ? fmt::format("{:.3f}s of it waiting for the write", write_waited_s_) : ""});
      if (rank_ == 0) {
        const std::string table = profile_table(whole);
        if (opts_.profile) std::fputs(table.c_str(), stdout), std::fflush(stdout);
        spdlog::info("{}", table);
      }
    } catch (const std::exception& e) {
      if (write_failed_) throw;  // its message names the run file
      fail("rank {}: comparison of '{}' failed: {}", rank_, out_, e.what());
    }
    return status;
  }

  void finish() {
    interrupt::verdict_reached();
    interrupt::set_phase("finishing");
    if (storing_.joinable()) storing_.join();
    watchdog_.reset();
    world_.barrier();
    if (rank_ == 0 && cache_.settings().enabled() && !cached_.hit) cache_.evict();  // every rank's file is in
    // Every rank's file is gone; on hosts that do not share the directory each
    // has its own (empty) watch directory to remove.
    std::error_code ec;
    std::filesystem::remove(out_ + ".watch", ec);
  }

  // Settled before the run, identically on every rank (in this order).
  Comm world_;
  const int rank_;
  const RunOptions opts_;
  const Scenario& scenario_;
  const DType dtype_;
  const Mesh mesh_;
  const FlagValues flags_;
  std::optional<ToleranceTable> file_table_;  // set as chaos_ is made
  Chaos chaos_;
  const std::string out_;
  TapRecorder taps_;
  const ReferenceCache cache_;
  // Where the run file goes and how it may be written.
  bool one_host_ = true, dir_shared_ = false;
  std::uint64_t gather_max_ = 0;
  std::unique_ptr<Watchdog> watchdog_;
  GemmPeak peak_;
  // The block.
  ReferenceCacheOutcome cached_;
  double load_s_ = 0, ran_ = 0, sharded_s_ = 0, reference_s_ = 0;
  std::string inject_;
  RunInfo info_;
  std::jthread storing_;
  // The run file.
  std::optional<PendingRunFile> begun_;
  long long begun_bytes_ = 0;
  std::optional<PendingRunFile> run_file_;
  CheckPlace check_place_ = CheckPlace::in_memory;
  bool write_beside_check_ = false, write_failed_ = false;
  double write_s_ = 0, write_waited_s_ = 0;
  std::vector<Phase> phases_;
  RunProfile profile_;
  // The check.
  ReportOptions report_;
  std::optional<ToleranceTable> calibrated_;
};

}  // namespace

int run_scenario(const RunOptions& given) { return ScenarioRun(Comm::world(), given)(); }

}  // namespace dc
