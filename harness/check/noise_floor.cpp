#include "harness/check/noise_floor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "harness/check/column_error.h"
#include "harness/core/error.h"
#include "harness/core/files.h"

namespace dc {

CompareOptions floor_measuring_options(CompareOptions base) {
  base.measure_floor = true;
  base.tolerances = nullptr;
  base.atol.reset();
  base.rtol.reset();
  return base;
}

Floors floors_of(const CompareResult& res) {
  Floors out;
  for (const auto& t : res.taps) {
    if (!t.reference.present) continue;
    out[t.name] = {t.reference.worst_ratio, t.reference.rel_l2, t.dtype, std::nullopt,
                   static_cast<std::size_t>(std::max(0LL, t.reference.n_total)), t.reference.column_mean,
                   std::nullopt, t.reference.column_mean ? column_layout(t.global_shape).columns : 0};
  }
  return out;
}

void keep_unperturbed(Floors& floors) {
  for (auto& [name, f] : floors) {
    if (f.elements >= kSameInputsMinElements) f.rel_l2_as_is = f.rel_l2;
    if (f.columns >= kSameInputsMinColumns) f.column_mean_as_is = f.column_mean;
  }
}

void merge_floors(Floors& into, const Floors& more) {
  for (const auto& [name, f] : more) {
    auto [it, fresh] = into.emplace(name, f);
    if (fresh) continue;
    // NaN wins: a floor that is not a number must not pass as a small one.
    auto worst = [](double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); };
    it->second.element = worst(it->second.element, f.element);
    it->second.rel_l2 = worst(it->second.rel_l2, f.rel_l2);
    if (f.rel_l2_as_is)  // only run 0 has one
      it->second.rel_l2_as_is = worst(it->second.rel_l2_as_is.value_or(0), *f.rel_l2_as_is);
    if (f.column_mean_as_is)
      it->second.column_mean_as_is = worst(it->second.column_mean_as_is.value_or(0), *f.column_mean_as_is);
    // A tap has column means in every run or in none (its shape decides).
    if (f.column_mean || it->second.column_mean)
      it->second.column_mean = worst(it->second.column_mean.value_or(NAN), f.column_mean.value_or(NAN));
  }
}

namespace {
std::string optional(const std::optional<double>& v) { return v ? fmt::format("{:.17g}", *v) : "-"; }
std::optional<double> optional(const std::string& s) {
  if (s.empty() || s == "-") return std::nullopt;
  return std::stod(s);
}
}  // namespace

std::string encode_floors(const Floors& f) {
  std::string s;
  for (const auto& [name, x] : f)
    s += fmt::format("{}\t{:.17g}\t{:.17g}\t{}\t{}\t{}\t{}\t{}\t{}\n", name, x.element, x.rel_l2, x.dtype,
                     optional(x.rel_l2_as_is), x.elements, optional(x.column_mean), optional(x.column_mean_as_is),
                     x.columns);
  return s;
}

Floors decode_floors(const std::string& text) {
  Floors out;
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) {
    std::stringstream ls(line);
    std::string name, e, l, dtype, as_is, elements, column, column_as_is, columns;
    std::getline(ls, name, '\t');
    std::getline(ls, e, '\t');
    std::getline(ls, l, '\t');
    std::getline(ls, dtype, '\t');
    std::getline(ls, as_is, '\t');
    std::getline(ls, elements, '\t');
    std::getline(ls, column, '\t');
    std::getline(ls, column_as_is, '\t');
    std::getline(ls, columns, '\t');
    auto count = [](const std::string& c) { return c.empty() ? std::size_t{0} : static_cast<std::size_t>(std::stoull(c)); };
    out[name] = {std::stod(e), std::stod(l), dtype, optional(as_is), count(elements), optional(column),
                 optional(column_as_is), count(columns)};
  }
  return out;
}

MeasuredTolerance tolerance_from_floor(const TapFloor& f, double k_element, double k_norm, double k_same) {
  // One rounding of the accumulator (float32 for 16- and 32-bit dtypes): a
  // floor of 0 (a tap no perturbation moved) still allows the last bit, while
  // a bfloat16 tap computed in float32 (an LSE) keeps its own, finer floor.
  const double u = accumulator_roundoff(f.dtype);
  MeasuredTolerance m;
  m.floor_element = f.element;
  m.floor_rel_l2 = f.rel_l2;
  m.rtol = k_element * f.element + u;
  m.rel_l2_limit = k_norm * f.rel_l2 + u;
  // On the run's own inputs the unperturbed run is the yardstick itself: no
  // other seed's spread and no perturbation to allow for.
  if (k_same > 0 && f.rel_l2_as_is && k_same * *f.rel_l2_as_is + u < m.rel_l2_limit) {
    m.rel_l2_limit_own_inputs = k_same * *f.rel_l2_as_is + u;
    m.floor_rel_l2_as_is = f.rel_l2_as_is;
  }
  // Column means: the norm's k (they are averages too) and the same rule on
  // the run's own inputs.
  if (f.column_mean) {
    m.floor_column_mean = f.column_mean;
    m.column_mean_limit = k_norm * *f.column_mean + u;
    if (k_same > 0 && f.column_mean_as_is && k_same * *f.column_mean_as_is + u < *m.column_mean_limit) {
      m.column_mean_limit_own_inputs = k_same * *f.column_mean_as_is + u;
      m.floor_column_mean_as_is = f.column_mean_as_is;
    }
  }
  return m;
}

namespace {
using nlohmann::json;
constexpr const char* kFormat = "diffcheck-tolerances";
constexpr int kFormatVersion = 1;

json num(double v) { return std::isfinite(v) ? json(v) : json(fmt::format("{}", v)); }
double number(const json& j) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) return std::stod(j.get<std::string>());
  throw std::runtime_error("not a number");
}
}  // namespace

void write_tolerance_file(const std::string& path, const ToleranceFile& f) {
  const auto& i = f.info;
  json j;
  j["format"] = kFormat;
  j["version"] = kFormatVersion;
  j["provenance"] = {{"diffcheck", i.diffcheck}, {"scenario", i.scenario}, {"size", i.size},
                     {"dtype", i.dtype},         {"flags", i.flags},       {"mesh", i.mesh},
                     {"steps", i.steps},         {"reference_mode", i.reference_mode},
                     {"seed", i.seed},           {"runs", i.runs},         {"k_element", i.k_element},
                     {"k_norm", i.k_norm},       {"k_same_inputs", i.k_same_inputs},
                     {"method", i.method}};
  j["taps"] = json::object();
  for (const auto& [name, x] : f.floors) {
    // The limits as a run on another seed applies them; one on this seed
    // tightens the norm to k_same_inputs x floor_rel_l2_as_is.
    const auto m = tolerance_from_floor(x, i.k_element, i.k_norm);
    j["taps"][name] = {{"dtype", x.dtype},
                       {"floor_element", num(x.element)},
                       {"floor_rel_l2", num(x.rel_l2)},
                       {"rtol", num(m.rtol)},
                       {"rel_l2_limit", num(m.rel_l2_limit)}};
    if (x.rel_l2_as_is) j["taps"][name]["floor_rel_l2_as_is"] = num(*x.rel_l2_as_is);
    if (x.column_mean) {
      j["taps"][name]["floor_column_mean"] = num(*x.column_mean);
      j["taps"][name]["column_mean_limit"] = num(*m.column_mean_limit);
    }
    if (x.column_mean_as_is) j["taps"][name]["floor_column_mean_as_is"] = num(*x.column_mean_as_is);
  }
  write_whole_file(path, j.dump(2) + "\n", "tolerance file");
}

ToleranceFile read_tolerance_file(const std::string& path) {
  return parse_tolerance_file(read_text_file(path, "tolerance file"), path);
}

ToleranceFile parse_tolerance_file(const std::string& text, const std::string& path) {
  ToleranceFile f;
  try {
    const json j = json::parse(text);
    if (j.value("format", "") != kFormat)
      input_error("'{}' is not a diffcheck tolerance file (its \"format\" is not \"{}\"; make one with "
                  "'diffcheck calibrate')", path, kFormat);
    if (j.value("version", 0) != kFormatVersion)
      input_error("tolerance file '{}' has version {}; this diffcheck reads version {}", path, j.value("version", 0),
                  kFormatVersion);
    const json& p = j.at("provenance");
    auto& i = f.info;
    i.diffcheck = p.value("diffcheck", "");
    i.scenario = p.value("scenario", "");
    i.size = p.value("size", "");
    i.dtype = p.value("dtype", "");
    i.flags = p.value("flags", "");
    i.mesh = p.value("mesh", "");
    i.steps = p.value("steps", 0);
    i.reference_mode = p.value("reference_mode", "");
    i.seed = p.value("seed", std::uint64_t{0});
    i.runs = p.value("runs", 0);
    i.k_element = number(p.at("k_element"));
    i.k_norm = number(p.at("k_norm"));
    i.k_same_inputs = p.contains("k_same_inputs") ? number(p.at("k_same_inputs")) : 0.0;
    i.method = p.value("method", "");
    if (!(i.k_element > 0) || !(i.k_norm > 0)) input_error("tolerance file '{}': k_element and k_norm must be > 0", path);
    if (!(i.k_same_inputs >= 0)) input_error("tolerance file '{}': k_same_inputs must be >= 0", path);
    for (const auto& [name, t] : j.at("taps").items()) {
      TapFloor x{number(t.at("floor_element")), number(t.at("floor_rel_l2")), t.value("dtype", i.dtype), std::nullopt};
      if (t.contains("floor_rel_l2_as_is")) x.rel_l2_as_is = number(t.at("floor_rel_l2_as_is"));
      // Files older than the column means have none: those taps keep the other limits.
      if (t.contains("floor_column_mean")) x.column_mean = number(t.at("floor_column_mean"));
      if (t.contains("floor_column_mean_as_is")) x.column_mean_as_is = number(t.at("floor_column_mean_as_is"));
      if (!(x.element >= 0) || !(x.rel_l2 >= 0) || !(x.rel_l2_as_is.value_or(0) >= 0) ||
          !(x.column_mean.value_or(0) >= 0) || !(x.column_mean_as_is.value_or(0) >= 0))
        input_error("tolerance file '{}': tap '{}' has a floor that is not a number >= 0", path, name);
      f.floors[name] = x;
    }
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    input_error("tolerance file '{}' is malformed: {}", path, e.what());
  }
  return f;
}

ToleranceTable tolerance_table(const ToleranceFile& f, ToleranceSource source, const std::string& origin,
                               bool same_inputs) {
  ToleranceTable t;
  t.source = source;
  t.origin = origin;
  const double k_same = same_inputs ? f.info.k_same_inputs : 0.0;
  for (const auto& [name, x] : f.floors)
    t.taps[name] = tolerance_from_floor(x, f.info.k_element, f.info.k_norm, k_same);
  return t;
}

bool same_inputs_as(const CalibrationInfo& i, std::uint64_t seed, const std::string& flags, int steps,
                    const std::string& reference_mode) {
  return i.seed == seed && i.flags == flags && i.steps == steps && i.reference_mode == reference_mode;
}

void require_matching_file(const ToleranceFile& f, const std::string& path, const std::string& scenario,
                           const std::string& size, const std::string& dtype) {
  const auto& i = f.info;
  auto differ = [&](const char* what, const std::string& file, const std::string& run) {
    if (file != run)
      input_error("tolerance file '{}' was calibrated for {} '{}', not '{}' (calibrate again: diffcheck calibrate "
                  "--scenario {} --size {} --dtype {} -o FILE)",
                  path, what, file, run, scenario, size, dtype);
  };
  differ("scenario", i.scenario, scenario);
  differ("size", i.size, size);
  differ("dtype", i.dtype, dtype);
}

}  // namespace dc
