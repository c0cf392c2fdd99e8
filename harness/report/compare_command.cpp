#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <iostream>
#include <optional>

#include "harness/report/compare_command.h"
#include "harness/check/against.h"
#include "harness/capture/store.h"
#include "harness/check/noise_floor.h"
#include "harness/check/tolerance.h"
#include "harness/report/report.h"
#include "harness/core/error.h"
#include "harness/core/agree.h"
#include "harness/core/files.h"

namespace dc {

namespace {


// A yardstick must be the same computation as the run: a floor measured in
// another dtype would hold the run to another computation's error. (One of
// another shape does not pair with the reference, which reading it finds.)
void require_same_computation(const ActivationSet& run, const ActivationSet& floor) {
  const std::string run_dtype = root_info(run, "dtype"), floor_dtype = root_info(floor, "dtype");
  if (!run_dtype.empty() && !floor_dtype.empty() && run_dtype != floor_dtype)
    input_error("noise floor {} is {} but the run {} is {} (each file's root attribute 'dtype'): capture the "
                "one-device run in the dtype the run computes in (dct.references(..., dtype=...)), or say the "
                "run's with capture(dtype=...)", floor.source, floor_dtype, run.source, run_dtype);
  // TF32 or autocast in one and not the other: the floor would measure other math.
  const std::string run_math = root_info(run, "math"), floor_math = root_info(floor, "math");
  if (!run_math.empty() && !floor_math.empty() && run_math != floor_math)
    input_error("noise floor {} was computed with math '{}' but the run {} with '{}': capture the one-device run "
                "with the same TF32 and autocast settings as the run", floor.source, floor_math, run.source, run_math);
  std::map<std::string, const TapData*> in_floor;
  for (const auto& t : floor.taps) in_floor[t.name] = &t;
  for (const auto& t : run.taps) {
    auto it = in_floor.find(t.name);
    if (it == in_floor.end()) continue;
    if (t.dtype.empty() || it->second->dtype.empty() || t.dtype == it->second->dtype) continue;
    // Mixed precision keeps parameters, their gradients and the optimizer's
    // values wider than it computes: such a tap's error is the compute
    // dtype's, which the floor (in that dtype, as the whole run) measures.
    if (it->second->dtype == run_dtype && unit_roundoff(t.dtype) > 0 &&
        unit_roundoff(t.dtype) < unit_roundoff(it->second->dtype))
      continue;
    input_error("tap '{}': the run {} is {} but the noise floor {} is {}: the one-device run must be captured "
                  "in the run's dtype", t.name, run.source, t.dtype, floor.source, it->second->dtype);
  }
}

// A one-device run in the run's dtype measures a noise floor only against a
// reference of higher precision (narrow_reference: float64, or float32 for a
// 16-bit run). A model that computes its "reference" in its
// own dtype (MaxText casts every layer to its config's) stores it as float32:
// the one-device run then equals it bit for bit, its floor is 0, and a clean
// run would fail. Those taps' floors are dropped (the derived rule holds
// them); the words for the note, empty when every reference is float64.
std::string drop_floors_of_narrow_references(const ActivationSet& floor_set, Floors& floors) {
  std::vector<std::string> narrow;
  std::string kind;
  const auto found = floor_set.info.find("dtype");
  const std::string run_dtype = found == floor_set.info.end() ? std::string{} : found->second;
  for (const auto& t : floor_set.taps)
    if (const std::string k = narrow_reference(t, run_dtype); !k.empty() && floors.erase(t.name)) {
      narrow.push_back(t.name);
      kind = k;
    }
  if (narrow.empty()) return {};
  const std::size_t shown = std::min<std::size_t>(narrow.size(), 3);
  return fmt::format("{} tap(s) have a reference stored as {}, not float64 ({}{}): no noise floor can be measured "
                     "against it, the derived rule holds them; compute the reference in float64 (the model's own "
                     "dtype setting) to measure one",
                     narrow.size(), kind, fmt::join(narrow.begin(), narrow.begin() + static_cast<long>(shown), ", "),
                     narrow.size() > shown ? ", ..." : "");
}

// The tolerance table of --tolerances FILE or --noise-floor SOURCE (or the
// one-device dump found beside the reference), if any; `note` says which.
std::optional<ToleranceTable> measured_tolerances(const ActivationSet& set, const std::string& reference,
                                                  const ReportOptions& opts, std::string& note) {
  if (!opts.tolerances_file.empty() && !opts.noise_floor.empty() && opts.noise_floor != "off")
    input_error("--tolerances FILE and --noise-floor SOURCE both say where tolerances come from: give one");
  if (!opts.tolerances_file.empty()) {
    const ToleranceFile f = read_tolerance_file(opts.tolerances_file);
    auto info = [&](const char* k) { return root_info(set, k); };
    // What the activations say of themselves: a file made for anything else is refused.
    require_matching_file(f, opts.tolerances_file, info("scenario").empty() ? f.info.scenario : info("scenario"),
                          info("size").empty() ? f.info.size : info("size"),
                          info("dtype").empty() ? f.info.dtype : info("dtype"));
    return tolerance_table(f, ToleranceSource::file, opts.tolerances_file);
  }
  std::string floor_source;
  bool found = false;  // beside the reference, not named
  if (opts.noise_floor.empty()) {
    floor_source = one_device_beside(reference);
    found = !floor_source.empty();
  } else if (opts.noise_floor != "off") {
    floor_source = opts.noise_floor;
  }
  if (floor_source.empty()) {
    if (!reference.empty() && opts.noise_floor.empty())
      note = "tolerances: derived from each tap's dtype and reduction depth (no one-device run beside the "
             "reference); for measured ones capture the unsharded model once in the run's dtype beside it "
             "(dct.capture(..., one_device=True), docs/torch.md) or give --noise-floor";
    return std::nullopt;
  }
  ActivationSet floor_set;
  try {
    floor_set = read_everywhere(floor_source, reference, opts.compare.processes, &set.stream_splits);
  } catch (const InputError& e) {
    input_error("noise floor {}: {}", floor_source, e.what());
  }
  // The one-device run is the same model as the reference, unsharded: a shape that differs is a wrong file
  // (another size, another model), not a finding of the run under check.
  for (const auto& t : floor_set.taps)
    if (t.mismatched_reference_shape)
      input_error("noise floor {}: {}:/reference/{}: reference shape {} does not match the tap's global shape {}",
                  floor_source, reference, t.name, shape_str(*t.mismatched_reference_shape),
                  shape_str(t.layout.global_shape(floor_set.mesh, t.local_shape)));
  require_same_computation(set, floor_set);
  ToleranceFile f;
  f.floors = floors_of(compare(floor_set, floor_measuring_options(opts.compare)));
  const std::string narrow = drop_floors_of_narrow_references(floor_set, f.floors);
  if (f.floors.empty() && !narrow.empty()) {  // no tap has a float64 reference: the derived rule for all
    note = "tolerances: derived from each tap's dtype and reduction depth: " + narrow;
    return std::nullopt;
  }
  if (f.floors.empty())
    input_error("noise floor {}{}: no tap there has a reference to measure a floor against (give --reference, or "
                "dump /reference/<tap> with it)", floor_source, found ? " (found beside the reference)" : "");
  if (found)
    note = fmt::format("tolerances: measured, the one-device run {}.rank0.h5 found beside the reference "
                       "(--noise-floor off judges by the derived rule instead)", floor_source);
  if (!narrow.empty()) note += (note.empty() ? "tolerances: " : "; ") + narrow;
  return tolerance_table(f, ToleranceSource::noise_floor, floor_source);
}

}  // namespace

ActivationSet read_everywhere(const std::string& source, const std::string& reference,
                              const Comm* processes, const std::map<std::string, StreamSplit>* split_like) {
  if (!processes || processes->size() == 1) return read_activations(source, reference, split_like);
  ActivationSet set;
  agreed_on_all(*processes, [&] {
    try {
      set = read_activations(source, reference, split_like);
    } catch (const InputError& e) {
      throw InputError(fmt::format("rank {}: {}", processes->rank(), e.what()));
    } catch (const std::exception& e) {
      throw Error(fmt::format("rank {}: {}", processes->rank(), e.what()));
    }
    return std::string();
  });
  return set;
}

std::string one_device_beside(const std::string& reference) {
  if (reference.empty()) return {};
  std::string stem = reference;
  for (const char* suffix : {".h5", ".rank0"})
    if (stem.size() > std::strlen(suffix) && stem.ends_with(suffix)) stem.resize(stem.size() - std::strlen(suffix));
  const std::string prefix = stem + ".one_device";
  std::error_code ec;
  return std::filesystem::is_regular_file(prefix + ".rank0.h5", ec) ? prefix : std::string();
}

int compare_and_report(const std::string& source, const std::string& reference,
                       const ReportOptions& opts) {
  const auto started = std::chrono::steady_clock::now();
  ActivationSet set = read_everywhere(source, reference, opts.compare.processes);
  ReportOptions with = opts;
  const std::optional<ToleranceTable> table = measured_tolerances(set, reference, opts, with.tolerance_note);
  if (table) with.compare.tolerances = &*table;
  return check_and_report(set, with, started);
}

int compare_against_and_report(const std::string& source, const std::string& against, bool exact,
                               const ReportOptions& opts) {
  const auto started = std::chrono::steady_clock::now();
  ActivationSet a = read_everywhere(source, "", opts.compare.processes);
  // A tap one run holds as streams (a joint sequence split over its ranks) is split alike in the other.
  ActivationSet b = read_everywhere(against, "", opts.compare.processes, &a.stream_splits);
  if (!b.stream_splits.empty() && a.stream_splits.size() < b.stream_splits.size())
    a = read_everywhere(source, "", opts.compare.processes, &b.stream_splits);
  // The run with the smaller batch is the one checked, on its samples.
  const bool swapped = batch_larger(a, b);
  if (swapped) std::swap(a, b);
  const AgainstMatch m = match_runs(a, b, {.exact = exact});
  ReportOptions with = opts;
  with.reference_source = m.describe();
  if (swapped)
    with.reference_source = fmt::format("{} holds more samples than {}: the runs are compared on the other's "
                                        "samples, so the other run is the one reported\n{}",
                                        source, against, with.reference_source);
  const std::optional<ToleranceTable> table = measured_tolerances(m.set, "", opts, with.tolerance_note);
  if (table) with.compare.tolerances = &*table;
  // The other run's own checks (NaN/Inf, replicas), as this run's are made
  // beside the comparison.
  const CompareResult own = compare(without_references(b), opts.compare);
  if (!own.pass()) {
    const TapVerdict& v = own.taps[*own.first_divergence];
    with.reference_source += fmt::format("\nFAIL in {} alone: tap '{}' fails its {} check", b.source, v.name,
                                         fmt::join(v.failed_checks(), " and "));
  }
  const int status = check_and_report(m.set, with, started);
  return own.pass() ? status : kExitMismatch;
}

int check_and_report(const ActivationSet& set, const ReportOptions& opts,
                     std::chrono::steady_clock::time_point started, std::optional<CompareResult> computed) {
  const Comm* processes = set.data->holders() ? set.data->holders() : opts.compare.processes;
  const std::string& source = set.source;
  const auto t0 = std::chrono::steady_clock::now();
  CompareResult res = computed ? std::move(*computed) : compare(set, opts.compare);
  res.reference_source = opts.reference_source;
  res.tolerance_note = opts.tolerance_note;
  res.profile = opts.profile;
  if (!opts.timings.empty()) {
    res.timings = opts.timings;
    res.timings.emplace_back("check_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  if (opts.before_report) opts.before_report(res.timings, res.profile);
  if (processes && processes->rank() != 0) return res.pass() ? kExitPass : kExitMismatch;
  std::ostringstream console;
  make_console_reporter()->report(set, res, console);
  std::cout << console.str();
  std::cout.flush();
  if (!opts.junit_path.empty()) {
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    for (const auto& [name, s] : opts.timings) seconds += s;  // a run's phases before the check
    JUnitSuite suite =
        junit_suite(set, res, opts.junit_name.empty() ? "compare " + source : opts.junit_name, seconds);
    suite.system_out = console.str();
    write_junit(opts.junit_path, {suite});
  }
  // Whole or absent, like run files.
  auto write_report = [&](const std::string& path, Reporter& reporter, const char* what) {
    if (path.empty()) return;
    std::ostringstream text;
    reporter.report(set, res, text);
    write_whole_file(path, text.str(), std::string(what) + " report");
  };
  write_report(opts.json_path, *make_json_reporter(), "JSON");
  write_report(opts.html_path, *make_html_reporter(), "HTML");
  return res.pass() ? kExitPass : kExitMismatch;
}

}  // namespace dc
