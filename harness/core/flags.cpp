#include "harness/core/flags.h"

#include <fmt/format.h>

#include <algorithm>

#include "harness/core/error.h"

namespace dc {
namespace {

bool parse_bool(const std::string& v, bool* out) {
  if (v == "1" || v == "true" || v == "on" || v == "yes") return *out = true, true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return *out = false, true;
  return false;
}

bool parse_int(const std::string& v, long* out) {
  if (v.empty()) return false;
  std::size_t pos = 0;
  try {
    *out = std::stol(v, &pos);
  } catch (...) {
    return false;
  }
  return pos == v.size();
}

}  // namespace

std::string flag_type_name(FlagType t) {
  switch (t) {
    case FlagType::boolean: return "bool";
    case FlagType::integer: return "int";
    default: return "string";
  }
}

std::vector<std::string> split_flag_list(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text) {
    if (c == ' ' || c == ',' || c == '\t' || c == '\n') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

FlagValues FlagValues::resolve(const std::vector<FlagSpec>& specs,
                               const std::vector<std::string>& assignments,
                               const std::string& scenario) {
  FlagValues fv;
  for (const auto& s : specs) {
    fv.values_[s.name] = s.default_value;
    fv.types_[s.name] = s.type;
  }
  for (const auto& a : assignments) {
    auto eq = a.find('=');
    std::string name = a.substr(0, eq);
    auto it = fv.types_.find(name);
    if (it == fv.types_.end()) {
      std::string known;
      for (const auto& s : specs) known += (known.empty() ? "" : ", ") + s.name;
      input_error("unknown flag '{}' for scenario '{}'; its flags are: {}", name, scenario,
                  known.empty() ? "(none)" : known);
    }
    std::string value = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (eq == std::string::npos) {
      if (it->second != FlagType::boolean)
        input_error("flag '{}' needs a value ({}=...)", name, name);
      value = "true";
    }
    bool b = false;
    long i = 0;
    if (it->second == FlagType::boolean && !parse_bool(value, &b))
      input_error("flag '{}' is a bool; '{}' is not one of true/false/1/0/on/off", name, value);
    if (it->second == FlagType::integer && !parse_int(value, &i))
      input_error("flag '{}' is an int; '{}' is not an integer", name, value);
    if (it->second == FlagType::boolean) value = b ? "true" : "false";
    fv.values_[name] = value;
  }
  return fv;
}

const std::string& FlagValues::raw(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) fail("flag '{}' read but never declared by the scenario", name);
  return it->second;
}

bool FlagValues::get_bool(const std::string& name) const { return raw(name) == "true"; }
long FlagValues::get_int(const std::string& name) const { return std::stol(raw(name)); }
const std::string& FlagValues::get_string(const std::string& name) const { return raw(name); }

std::string FlagValues::str() const {
  std::string s;
  for (const auto& [k, v] : values_) s += fmt::format("{}{}={}", s.empty() ? "" : " ", k, v);
  return s;
}

std::vector<std::string> matrix_values(const FlagSpec& f) {
  if (!f.matrix_values.empty()) return f.matrix_values;
  if (f.type == FlagType::boolean) return {"false", "true"};
  return {f.default_value};
}

}  // namespace dc
