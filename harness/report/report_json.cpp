#include <cmath>
#include <nlohmann/json.hpp>

#include "harness/report/json_number.h"
#include "harness/report/report.h"
#include "harness/report/steps.h"

namespace dc {
namespace {

using nlohmann::json;

json element(const std::optional<ElementRef>& e) {
  if (!e) return nullptr;
  return {{"rank", e->rank}, {"index", e->index}};
}

json tap_json(const TapVerdict& t, std::size_t order) {
  json j;
  j["order"] = order;
  j["name"] = t.name;
  j["layout"] = t.layout;
  j["dtype"] = t.dtype;
  j["local_shape"] = t.local_shape;
  j["global_shape"] = t.global_shape;
  if (!t.stage.empty()) j["stage"] = t.stage;
  if (t.microbatches > 0) j["microbatches"] = t.microbatches;
  if (!t.wrong_microbatches.empty()) j["wrong_microbatches"] = t.wrong_microbatches;
  if (!t.microbatch_copies_differ.empty()) j["microbatch_copies_differ"] = t.microbatch_copies_differ;
  // A tap never compared with the reference is no pass, whatever the run's verdict.
  j["pass"] = t.passed_every_check();
  j["verdict"] = !t.pass() ? "fail" : t.unchecked ? "unchecked" : "pass";
  j["failed_checks"] = t.failed_checks();
  const auto& nf = t.nonfinite;
  j["nonfinite"] = {{"nan", nf.nan}, {"inf", nf.inf}, {"first_nan", element(nf.first_nan)},
                    {"first_inf", element(nf.first_inf)}, {"ranks", nf.ranks}};
  const auto& rc = t.replica;
  j["replica"] = {{"applies", rc.applies}, {"pass", rc.pass}, {"by_hash", rc.by_hash}, {"max_abs", json_number(rc.max_abs)},
                  {"max_ulp", rc.max_ulp}, {"differing_ranks", rc.differing}};
  if (!rc.differing.empty())
    j["replica"]["worst"] = {{"leader", rc.leader}, {"other", rc.other}, {"index", rc.index},
                             {"axes", rc.axes},
                             {"leader_value", json_number(rc.leader_value)},
                             {"other_value", json_number(rc.other_value)}};
  const auto& ref = t.reference;
  j["reference"] = {{"present", ref.present}, {"pass", ref.pass && !t.unchecked}};
  if (t.unchecked) j["reference"]["unchecked"] = true;
  if (!ref.narrow_reference.empty()) j["reference"]["stored"] = ref.narrow_reference;
  if (ref.mismatched_shape) j["reference"]["shape"] = {{"reference", *ref.mismatched_shape}, {"global", t.global_shape}};
  if (ref.other_run) j["reference"]["other_run"] = true;  // compare --against: no reference was used
  if (ref.present) {
    j["reference"].update({{"atol", json_number(ref.tol.atol)}, {"rtol", json_number(ref.tol.rtol)},
                           {"max_abs", json_number(ref.max_abs)}, {"max_rel", json_number(ref.max_rel)},
                           {"rel_l2", json_number(ref.rel_l2)}, {"n_fail", ref.n_fail},
                           {"n_total", ref.n_total}, {"worst_index", ref.worst.index},
                           {"worst_ranks", ref.worst_ranks}, {"failing_ranks", ref.failing_ranks}, {"worst_value", json_number(ref.worst_value)},
                           {"worst_reference", json_number(ref.worst_reference)},
                           {"worst_ratio", json_number(ref.worst_ratio)},
                           {"margin", json_number(ref.margin())},
                           {"worst_microbatch", t.microbatch_of(ref.worst.index, true)},
                           {"tolerance_source", source_name(ref.tol.source)}});
    if (!ref.tol.yardstick.empty()) j["reference"]["yardstick"] = ref.tol.yardstick;
    if (ref.tol.rel_l2_limit)
      j["reference"].update({{"rel_l2_limit", json_number(*ref.tol.rel_l2_limit)}, {"l2_ratio", json_number(ref.l2_ratio.value_or(0))}});
    if (ref.column_mean) j["reference"]["column_mean"] = json_number(*ref.column_mean);
    if (ref.estimated) j["reference"].update({{"estimated", true}, {"estimate_bound", json_number(ref.estimate_bound)}});
    if (ref.tol.column_mean_limit)
      j["reference"].update({{"column_mean_limit", json_number(*ref.tol.column_mean_limit)},
                             {"column_ratio", json_number(ref.column_ratio.value_or(0))}});
    if (const auto* m = ref.tol.measured)
      j["reference"]["noise_floor"] = {{"element", json_number(m->floor_element)}, {"rel_l2", json_number(m->floor_rel_l2)},
                                       {"clean_margin_element", m->floor_element > 0 ? json_number(m->rtol / m->floor_element) : json(nullptr)},
                                       {"clean_margin_rel_l2", m->floor_rel_l2 > 0 ? json_number(m->rel_l2_limit / m->floor_rel_l2) : json(nullptr)}};
    // Held to the one-device error on the run's own inputs: that is the clean run's yardstick.
    if (const auto* m = ref.tol.measured; m && ref.tol.own_inputs) {
      auto& nf = j["reference"]["noise_floor"];
      nf["rel_l2_as_is"] = json_number(*m->floor_rel_l2_as_is);
      nf["clean_margin_rel_l2"] =
          *m->floor_rel_l2_as_is > 0 ? json_number(*ref.tol.rel_l2_limit / *m->floor_rel_l2_as_is) : json(nullptr);
    }
    if (const auto* m = ref.tol.measured; m && ref.tol.column_mean_limit) {
      auto& nf = j["reference"]["noise_floor"];
      const double floor = ref.tol.column_own_inputs ? *m->floor_column_mean_as_is : m->floor_column_mean.value_or(0);
      nf[ref.tol.column_own_inputs ? "column_mean_as_is" : "column_mean"] = json_number(floor);
      nf["clean_margin_column_mean"] = floor > 0 ? json_number(*ref.tol.column_mean_limit / floor) : json(nullptr);
    }
  }
  // Every rank's share (index = rank), for pictures of the whole mesh.
  auto nums = [](const std::vector<double>& v) {
    json a = json::array();
    for (double x : v) a.push_back(json_number(x));
    return a;
  };
  j["ranks"] = {{"nonfinite", t.ranks.nonfinite}, {"replica_diff", nums(t.ranks.replica_diff)}};
  j["ranks"]["err_over_tol"] = ref.present ? nums(t.ranks.err_over_tol) : json(nullptr);
  return j;
}

class JsonReporter final : public Reporter {
 public:
  void report(const ActivationSet& set, const CompareResult& res, std::ostream& out) override {
    json j;
    j["source"] = set.source;
    j["mesh"] = set.mesh.str();
    j["world_size"] = set.world_size;
    j["info"] = set.info;
    j["pass"] = res.pass();
    j["unchecked_taps"] = res.unchecked_taps();  // not compared with the reference: no pass (--require-reference: a failure)
    j["taps"] = json::array();
    for (std::size_t i = 0; i < res.taps.size(); ++i) j["taps"].push_back(tap_json(res.taps[i], i));
    if (res.first_divergence) {
      const auto& t = res.taps[*res.first_divergence];
      j["first_divergence"] = {{"tap", t.name}, {"order", *res.first_divergence},
                               {"checks", t.failed_checks()},
                               {"summary", describe_first_divergence(set, res)}};
    } else {
      j["first_divergence"] = nullptr;
    }
    if (const auto steps = summarize_steps(res); !steps.empty()) {
      j["steps"] = json::array();
      for (const auto& s : steps)
        j["steps"].push_back({{"step", s.step}, {"taps", s.taps}, {"worst_err_over_tol", json_number(s.worst_ratio)},
                              {"worst_tap", s.worst_tap},
                              {"first_failing_tap", s.first_failing ? json(*s.first_failing) : json(nullptr)}});
    }
    if (!res.images.empty()) {
      j["images"] = json::array();
      for (const auto& im : res.images)
        j["images"].push_back({{"tap", im.tap}, {"item", im.item}, {"height", im.height}, {"width", im.width},
                               {"channels", im.channels}, {"data_range", im.data_range}, {"data_low", im.data_low}, {"psnr", json_number(im.psnr)},
                               {"ssim", json_number(im.ssim)},
                               {"gate", {{"ssim_min", kGateSsim}, {"psnr_min", kGatePsnr}, {"pass", im.gate_pass}}}});
      // The last image tap's first item: a pipeline's final image.
      j["final_image"] = j["images"].back();
      for (auto it = j["images"].rbegin(); it != j["images"].rend(); ++it)
        if ((*it)["tap"] == j["images"].back()["tap"] && (*it)["item"] == 0) j["final_image"] = *it;
    }
    j["tolerance_fallbacks"] = res.tolerance_fallbacks;  // taps the tolerance table did not name
    if (!res.reference_source.empty()) j["reference_source"] = res.reference_source;
    if (!res.tolerance_note.empty()) j["tolerance_note"] = res.tolerance_note;
    if (!res.profile.empty()) {
      j["profile"] = json::object();
      for (const auto& [name, v] : res.profile) j["profile"][name] = v;
    }
    if (!res.timings.empty()) {
      j["timings"] = json::object();
      for (const auto& [name, s] : res.timings) j["timings"][name] = s;
    }
    out << j.dump(2) << "\n";
  }
};

}  // namespace

std::unique_ptr<Reporter> make_json_reporter() { return std::make_unique<JsonReporter>(); }

}  // namespace dc
