#pragma once
// A number as diffcheck's JSON reports write it.

#include <cmath>
#include <nlohmann/json.hpp>

namespace dc {

// JSON has no NaN or Infinity: they are written as the strings "nan", "inf"
// and "-inf", so the file stays valid.
inline nlohmann::json json_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

}  // namespace dc
