#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "harness/report/report.h"
#include "harness/report/steps.h"

namespace dc {
namespace {

std::string sci(double v) {
  if (std::isnan(v)) return "nan";
  if (v == 0) return "0";
  return fmt::format("{:.2e}", v);
}

std::string nonfinite_cell(const NonFinite& nf) {
  if (!nf.nan && !nf.inf) return "-";
  return fmt::format("{}/{}", nf.nan, nf.inf);
}

std::string replica_cell(const ReplicaCheck& rc) {
  if (!rc.applies) return "n/a";
  if (rc.differing.empty()) return "equal";
  if (rc.by_hash) return "bits differ";
  if (rc.max_ulp == std::numeric_limits<long long>::max()) return fmt::format("{} (nan)", sci(rc.max_abs));
  return fmt::format("{} ({}ulp)", sci(rc.max_abs), rc.max_ulp);
}

std::string truncate(const std::string& s, std::size_t w) {
  return s.size() <= w ? s : s.substr(0, w - 1) + "~";
}

// The tap column's width: 40, or as wide as the longest name where cutting at
// 40 would print two different taps under one name.
std::size_t tap_name_width(const CompareResult& res) {
  constexpr std::size_t kCut = 40;
  std::size_t longest = 4;
  std::set<std::string> cut, seen;
  bool collide = false;
  for (const auto& t : res.taps) {
    longest = std::max(longest, t.name.size());
    if (!seen.insert(t.name).second) continue;  // one tap's name twice (steps, stages) is no collision
    collide = !cut.insert(truncate(t.name, kCut)).second || collide;
  }
  return collide ? longest : std::min(longest, kCut);
}

// One line per step of a pipeline: its worst err/tol and where.
void print_steps(const CompareResult& res, std::ostream& out) {
  const auto steps = summarize_steps(res);
  if (steps.size() < 2) return;
  const std::string first = res.first_divergence ? res.taps[*res.first_divergence].name : "";
  out << fmt::format("\nPer step: worst err/tol against the reference (> 1 fails) and its tap\n");
  for (const auto& s : steps) {
    std::string verdict = s.first_failing ? "FAIL at " + *s.first_failing : "PASS";
    if (s.first_failing && first == s.step + "/" + *s.first_failing) verdict += "  <- first divergence";
    out << fmt::format("  {:<8} {:>9}  {:<24}  {}\n", s.step, sci(s.worst_ratio), truncate(s.worst_tap, 24), verdict);
  }
}

// The image taps as an image gate sees them, beside diffcheck's verdict.
void print_images(const CompareResult& res, std::ostream& out) {
  for (const auto& im : res.images) {
    out << fmt::format("\nImage '{}' item {} ({}x{}): PSNR {:.2f} dB, SSIM {:.4f} against the reference; an image gate "
                       "(SSIM >= {:.2f}, PSNR >= {:.0f}) would {} it{}\n",
                       im.tap, im.item, im.width, im.height, im.psnr, im.ssim, kGateSsim, kGatePsnr,
                       im.gate_pass ? "PASS" : "FAIL", im.gate_pass && !res.pass() ? " (diffcheck does not)" : "");
  }
}

class ConsoleReporter final : public Reporter {
 public:
  void report(const ActivationSet& set, const CompareResult& res, std::ostream& out) override {
    std::string title = set.info.count("scenario") ? set.info.at("scenario") : set.source;
    out << fmt::format("diffcheck: {}  mesh {}  ({} ranks)", title, set.mesh.str(), set.world_size);
    if (set.info.count("dtype")) out << "  dtype " << set.info.at("dtype");
    if (set.info.count("flags") && !set.info.at("flags").empty())
      out << "  flags: " << set.info.at("flags");
    out << "\n";
    // Data parallelism's loss convention: the output gradients' scale depends on it (docs/torch.md).
    if (set.info.count("loss_scale")) out << "loss scale: " << set.info.at("loss_scale") << "\n";
    // Values the capture could describe with no layout and so did not write: never a silent gap.
    if (set.info.count("left_out")) out << "left out at capture: " << set.info.at("left_out") << "\n";
    if (!res.reference_source.empty()) out << res.reference_source << "\n";
    if (!res.tolerance_note.empty()) out << res.tolerance_note << "\n";
    const std::size_t wname = tap_name_width(res);
    std::size_t wlay = 6;
    for (const auto& t : res.taps) wlay = std::max(wlay, std::min<std::size_t>(t.layout.size(), 28));
    std::size_t wtol = 11;
    for (const auto& t : res.taps)
      if (t.reference.present) wtol = std::max(wtol, tolerance_column(t.reference).size());
    auto row = [&](auto... cells) {
      out << fmt::format("{:>3}  {:<{}}  {:<{}}  {:>8}  {:>18}  {:>9}  {:>9}  {:>9}  {:>9}  {:<{}}  {}\n", cells...);
    };
    row("#", "tap", wname, "layout", wlay, "nan/inf", "replica diff", "max abs", "max rel", "rel L2", "err/tol",
        "tolerance", wtol, "verdict");
    for (std::size_t i = 0; i < res.taps.size(); ++i) {
      const auto& t = res.taps[i];
      const auto& rc = t.reference;
      std::string verdict = !t.pass() ? "FAIL" : t.unchecked ? "UNCHECKED (no reference)" : "PASS";
      if (!t.pass()) {
        std::string checks;
        for (const auto& c : t.failed_checks()) checks += (checks.empty() ? "" : ",") + c;
        verdict += " (" + checks + ")";
      }
      if (res.first_divergence == i) verdict += "  <- first divergence";
      row(i, truncate(t.name, wname), wname, truncate(t.layout, 28), wlay, nonfinite_cell(t.nonfinite),
          replica_cell(t.replica), rc.present && !rc.estimated ? sci(rc.max_abs) : rc.present ? "(sketch)" : "-",
          rc.present && !rc.estimated ? sci(rc.max_rel) : "-",
          rc.present ? (rc.estimated ? "~" : "") + sci(rc.rel_l2) : "-",
          rc.present ? sci(rc.margin()) : "-", rc.present ? tolerance_column(rc) : "-", wtol, verdict);
    }
    print_steps(res, out);
    print_images(res, out);
    if (!res.tolerance_fallbacks.empty())
      out << fmt::format("\nWARNING: {} tap(s) not in the tolerance table keep the derived rule: {}\n",
                         res.tolerance_fallbacks.size(), fmt::join(res.tolerance_fallbacks, ", "));
    std::size_t failed = std::count_if(res.taps.begin(), res.taps.end(),
                                       [](const TapVerdict& t) { return !t.pass(); });
    out << "\n";
    const auto unchecked = res.unchecked_taps();
    if (res.pass() && unchecked.empty()) {
      const bool referenced = std::any_of(res.taps.begin(), res.taps.end(),
                                          [](const TapVerdict& t) { return t.reference.present; });
      out << fmt::format("PASS: all {} taps pass ({})\n", res.taps.size(),
                         referenced ? "non-finite, replica, reference checks" : "non-finite and replica checks; no reference");
    } else if (res.pass()) {
      out << fmt::format("PASS: {} taps pass; {}\n", res.taps.size() - unchecked.size(), unchecked_sentence(unchecked));
    } else {
      out << fmt::format("FAIL: {} of {} taps fail.\n", failed, res.taps.size());
      // Under --require-reference they are failures, counted above; else they are said apart.
      if (!unchecked.empty() && !res.taps[*res.first_divergence].unchecked_fails)
        out << fmt::format("{}\n", unchecked_sentence(unchecked));
      out << describe_first_divergence(set, res);
    }
  }
};

}  // namespace

std::unique_ptr<Reporter> make_console_reporter() { return std::make_unique<ConsoleReporter>(); }

std::string describe_first_divergence(const ActivationSet&, const CompareResult& res) {
  if (res.pass()) return "";
  return "First divergence: " + describe_tap(res.taps[*res.first_divergence], *res.first_divergence);
}

std::string unchecked_sentence(const std::vector<std::string>& names) {
  constexpr std::size_t kNamed = 5;
  std::vector<std::string> first(names.begin(), names.begin() + std::min(names.size(), kNamed));
  return fmt::format("{} not checked against the reference (no reference tap): {}{}", names.size(),
                     fmt::join(first, ", "), names.size() > kNamed ? fmt::format(" and {} more", names.size() - kNamed) : "");
}

std::string tolerance_cell(const Tolerance& tol) {
  std::string s = source_name(tol.source);
  if (tol.yardstick.empty()) return s;
  // "derived d1536 TF32": the depth and the math; the rest is in the tap's paragraph.
  if (tol.depth) s += fmt::format(" d{}", *tol.depth);
  if (tol.math_label.empty()) return s;
  const std::string math = tol.math_label.rfind("TF32", 0) == 0 ? "TF32" : tol.math_label;
  return s + " " + math.substr(0, math.find(" ("));
}


std::string tolerance_column(const ReferenceCheck& ref) {
  const std::string cell = tolerance_cell(ref.tol);
  return ref.narrow_reference.empty() ? cell : cell + ", ref " + ref.narrow_reference;
}

std::string math_hint(const ReferenceCheck& ref) {
  const auto& tol = ref.tol;
  const double margin = ref.margin();
  if (ref.pass || !(margin > 1) || tol.rtol <= 0) return "";
  auto fits = [&](double rtol) { return rtol > 0 && margin * tol.rtol / rtol <= 1; };
  const char* tail =
      ": if the run did that math, record it in the root attribute `math` (diffcheck.torch does) or capture the "
      "one-device run in the same math (docs/torch.md, Tolerances)\n";
  if (fits(tol.rtol_if_tf32))
    return std::string("  an error of the size TF32 matmuls give (torch.backends.cuda.matmul.allow_tf32, "
                       "set_float32_matmul_precision('high'), XLA's default GPU precision)") + tail;
  if (fits(tol.rtol_if_bf16))
    return std::string("  an error of the size bfloat16 matmuls give (autocast, "
                       "set_float32_matmul_precision('medium'))") + tail;
  return "";
}

std::string tolerance_line(const ReferenceCheck& ref) {
  const auto& tol = ref.tol;
  // A sketch tap has no element-wise check: its line starts at the norm-wise limit.
  std::string s = fmt::format("{}{}", source_name(tol.source), tol.yardstick.empty() ? "" : " (" + tol.yardstick + ")");
  if (!ref.narrow_reference.empty())
    s += fmt::format(" [the reference is {}, not float64: no more precise than the run]", ref.narrow_reference);
  if (tol.reduced_pieces > 1 && (tol.measured || tol.source == ToleranceSource::derived))
    s += tol.measured ? fmt::format(" [summed over {} ranks in its dtype before the capture (`reduced`): limits x{:.3g}]",
                                    tol.reduced_pieces, std::sqrt(static_cast<double>(tol.reduced_pieces)))
                      : fmt::format(" [summed over {} ranks in its dtype before the capture (`reduced`): {} more "
                                    "roundings counted]", tol.reduced_pieces, tol.reduced_pieces - 1);
  if (!ref.estimated) s += fmt::format(": atol {} + rtol {}*|ref|", sci(tol.atol), sci(tol.rtol));
  if (ref.estimated && !tol.measured && tol.rel_l2_limit) s += fmt::format(": rel L2 <= {}", sci(*tol.rel_l2_limit));
  if (tol.measured) {
    const auto& m = *tol.measured;
    auto margin = [](double limit, double floor) {
      return floor > 0 ? fmt::format("clean margin {:.3g}x", limit / floor) : std::string("floor 0");
    };
    const double limit = tol.rel_l2_limit.value_or(m.rel_l2_limit);
    if (ref.estimated || !std::isfinite(m.floor_element))  // no element figure (a sketch, or a floor made of sketches)
      s += fmt::format("{} rel L2 <= {} ", ref.estimated ? ":" : " (no element floor: the floor was sketched),", sci(limit));
    else
      s += fmt::format(" (noise floor {}, {}), rel L2 <= {} ", sci(m.floor_element), margin(m.rtol, m.floor_element),
                       sci(limit));
    if (tol.own_inputs)
      s += fmt::format("(one-device error on this run's inputs {}, {})", sci(*m.floor_rel_l2_as_is),
                       margin(limit, *m.floor_rel_l2_as_is));
    else
      s += fmt::format("(noise floor {}, {})", sci(m.floor_rel_l2), margin(limit, m.floor_rel_l2));
    if (tol.column_mean_limit) {
      const double floor = tol.column_own_inputs ? *m.floor_column_mean_as_is : m.floor_column_mean.value_or(0);
      s += fmt::format(", column mean <= {} ({} {}, {})", sci(*tol.column_mean_limit),
                       tol.column_own_inputs ? "one-device error on this run's inputs" : "noise floor", sci(floor),
                       margin(*tol.column_mean_limit, floor));
    }
  }
  return s + fmt::format("; err/tol {}", sci(ref.margin()));
}

// " (microbatch k of M)" for an element of a pipeline's microbatched tap.
static std::string microbatch_note(const TapVerdict& t, const std::vector<std::size_t>& index, bool global) {
  const long mb = t.microbatch_of(index, global);
  return mb < 0 ? std::string() : fmt::format(" (microbatch {} of {})", mb, t.microbatches);
}

// The dimensions where two shapes of one rank differ, and whether they hold
// the same sizes in another order (a transpose, an all-to-all's scatter and
// gather dimensions swapped) or other sizes (a gather left out, a wrong split).
static std::string shape_difference(const Shape& got, const Shape& want) {
  if (got.size() != want.size())
    return fmt::format("{} dimensions against {}", got.size(), want.size());
  std::vector<std::size_t> dims, a, b;
  for (std::size_t d = 0; d < got.size(); ++d)
    if (got[d] != want[d]) {
      dims.push_back(d);
      a.push_back(got[d]);
      b.push_back(want[d]);
    }
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  const bool many = dims.size() > 1;
  return fmt::format("dimension{} {} {}", many ? "s" : "", fmt::join(dims, ", "),
                     a == b ? "hold the same sizes in another order (swapped)" : many ? "differ in size" : "differs in size");
}

// A tap whose global shape is not its reference's: what each is, where they
// differ, and where a missing layout could be the cause, that possibility.
static std::string shape_paragraph(const TapVerdict& t) {
  const Shape& ref = *t.reference.mismatched_shape;
  std::string s = fmt::format("  SHAPE differs: the tap's global shape {} (local {}, layout {}) against the "
                              "reference's {}: {}\n",
                              shape_str(t.global_shape), shape_str(t.local_shape), t.layout, shape_str(ref),
                              shape_difference(t.global_shape, ref));
  if (t.layout.rfind("replicated", 0) == 0 && t.local_shape.size() == ref.size() &&
      numel(t.local_shape) * 2 <= numel(ref))
    s += "  the rank files call it replicated and the reference is larger: if the tap is sharded, give it a layout "
         "(its 'spec' attribute; layouts= in diffcheck.torch)\n";
  return s;
}

// The non-finite values of a tap: counts, ranks, the first NaN and Inf.
static std::string nonfinite_paragraph(const TapVerdict& t) {
  std::string s;
  const auto& nf = t.nonfinite;
  if (nf.nan || nf.inf) {
    s += fmt::format("  non-finite: {} NaN, {} Inf on ranks {}", nf.nan, nf.inf, rank_ranges(nf.ranks));
    if (nf.first_nan && nf.first_nan->index.empty())
      s += fmt::format("; first NaN on rank {} (a sketch: counts only)", nf.first_nan->rank);
    else if (nf.first_nan)
      s += fmt::format("; first NaN on rank {} at {}{}", nf.first_nan->rank, index_str(nf.first_nan->index),
                       microbatch_note(t, nf.first_nan->index, false));
    if (nf.first_inf && nf.first_inf->index.empty())
      s += fmt::format("; first Inf on rank {} (a sketch: counts only)", nf.first_inf->rank);
    else if (nf.first_inf)
      s += fmt::format("; first Inf on rank {} at {}{}", nf.first_inf->rank, index_str(nf.first_inf->index),
                       microbatch_note(t, nf.first_inf->index, false));
    s += "\n";
  }
  return s;
}

std::string describe_tap(const TapVerdict& t, std::size_t index) {
  std::string s = fmt::format("tap '{}' (#{}), layout {}, local {} global {}\n", t.name, index, t.layout,
                              shape_str(t.local_shape), shape_str(t.global_shape));
  s += nonfinite_paragraph(t);
  const auto& rc = t.replica;
  if (!rc.pass && rc.by_hash) {
    s += fmt::format("  replicas DIFFER across {}: the bits of ranks {} differ from their replica-group leader's "
                     "(first: rank {} against rank {}; a sketch has hashes, no values: capture again with "
                     "only=report for the elements)\n",
                     fmt::join(rc.axes, ", "), rank_ranges(rc.differing), rc.other, rc.leader);
  } else if (!rc.pass) {
    s += fmt::format(
        "  replicas DIFFER across {}: ranks {} disagree with their replica-group leader; largest difference "
        "{} ({} ULP) between rank {} and rank {} at local index {} (rank {}: {:.9g}, rank {}: {:.9g})\n",
        fmt::join(rc.axes, ", "), rank_ranges(rc.differing), sci(rc.max_abs),
        rc.max_ulp == std::numeric_limits<long long>::max() ? std::string("inf") : std::to_string(rc.max_ulp),
        rc.leader, rc.other, index_str(rc.index) + microbatch_note(t, rc.index, false), rc.leader, rc.leader_value, rc.other,
        rc.other_value);
  } else if (rc.applies) {
    s += "  replicas agree (bitwise)\n";
  }
  if (!t.microbatch_copies_differ.empty())
    s += fmt::format("  microbatches DIFFER: the tap has no batch dimension, so every microbatch computes the same "
                     "value, written once; the copies of {} are not microbatch 0's\n",
                     fmt::join(t.microbatch_copies_differ, "; "));
  const auto& ref = t.reference;
  if (ref.mismatched_shape) s += shape_paragraph(t);
  if (ref.present && !ref.pass && ref.estimated) {
    s += fmt::format("  reference DISAGREES (from sketches): rel L2 ~{} (+-{:.0f}%, estimated) over its limit {} "
                     "({:.3g}x){}; a sketch has no element values: capture again with only=report for the worst "
                     "element and its ranks\n",
                     sci(ref.rel_l2), 100 * ref.estimate_bound, sci(*ref.tol.rel_l2_limit),
                     ref.l2_ratio.value_or(NAN),
                     ref.column_ratio && !(*ref.column_ratio <= 1)
                         ? fmt::format(", and the column-mean error {} over its limit {} ({:.3g}x)",
                                       sci(*ref.column_mean), sci(*ref.tol.column_mean_limit), *ref.column_ratio)
                         : "");
    s += "  tolerance " + tolerance_line(ref) + "\n" + math_hint(ref);
  } else if (ref.present && !ref.pass) {
    const bool l2_fails = ref.l2_ratio && !(*ref.l2_ratio <= 1);
    const bool column_fails = ref.column_ratio && !(*ref.column_ratio <= 1);
    const char* yardstick = ref.other_run ? "the other run" : "reference";
    s += fmt::format(
        "  {} DISAGREES: {} of {} elements outside atol {} + rtol {}*|ref|{}; max abs err {}, "
        "max rel err {}, rel L2 {}; worst at global index {}{} on rank(s) {}{}: got {:.6g}, "
        "{} {:.6g}\n",
        yardstick, ref.n_fail, ref.n_total, sci(ref.tol.atol), sci(ref.tol.rtol),
        (l2_fails ? fmt::format(", and rel L2 {} over its limit {} ({:.3g}x)", sci(ref.rel_l2),
                                sci(*ref.tol.rel_l2_limit), *ref.l2_ratio)
                  : "") +
            (column_fails ? fmt::format(", and the column-mean error {} over its limit {} ({:.3g}x: an error shared by "
                                        "every token of a column)",
                                        sci(*ref.column_mean), sci(*ref.tol.column_mean_limit), *ref.column_ratio)
                          : ""),
        sci(ref.max_abs), sci(ref.max_rel), sci(ref.rel_l2), index_str(ref.worst.index),
        microbatch_note(t, ref.worst.index, true), rank_ranges(ref.worst_ranks),
        t.stage.empty() ? std::string() : " (stage " + t.stage + ")", ref.worst_value, yardstick, ref.worst_reference);
    if (!ref.failing_ranks.empty() && ref.failing_ranks != ref.worst_ranks)
      s += fmt::format("  elements outside the tolerance on rank(s) {}, not only the worst's\n",
                       rank_ranges(ref.failing_ranks));
    s += "  tolerance " + tolerance_line(ref) + "\n" + math_hint(ref);
    if (!t.wrong_microbatches.empty())
      s += fmt::format("  wrong in microbatch{} {} of {}{}\n", t.wrong_microbatches.size() > 1 ? "es" : "",
                       fmt::join(t.wrong_microbatches, ", "), t.microbatches,
                       t.stage.empty() ? std::string() : " (stage " + t.stage + ")");
  } else if (ref.present) {
    s += fmt::format("  {} agrees within tolerance{}\n", ref.other_run ? "the other run" : "reference",
                     rc.pass ? "" : " on the replica-group leaders (the ranks that differ from them are listed above)");
  }
  return s;
}

}  // namespace dc
