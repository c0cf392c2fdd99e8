#include "harness/check/math_mode.h"

#include <cmath>
#include <map>
#include <sstream>

#include "harness/core/error.h"

namespace dc {
namespace {

double roundoff_of(const std::string& dtype) {
  if (dtype == "bfloat16") return std::ldexp(1.0, -8);
  if (dtype == "float16") return std::ldexp(1.0, -11);
  return 0;
}

}  // namespace

MathRounding math_rounding(const std::string& math, const std::string& dtype, const std::string& where) {
  std::map<std::string, std::string> kv;
  std::istringstream in(math);
  for (std::string word; in >> word;) {
    const auto eq = word.find('=');
    if (eq == std::string::npos || eq == 0)
      input_error("{}: root attribute 'math' is '{}': expected name=value pairs separated by spaces", where, math);
    kv[word.substr(0, eq)] = word.substr(eq + 1);
  }
  auto get = [&](const char* k) { auto it = kv.find(k); return it == kv.end() ? std::string() : it->second; };
  const std::string device = get("device");
  const bool cuda = device != "cpu", cpu = device != "cuda";
  MathRounding r;
  auto take = [&](double u, std::string label) {
    if (u > r.roundoff) r = {u, std::move(label)};
  };
  if (dtype == "float32" && cuda) {
    const std::string precision = get("float32_matmul_precision");
    if (precision == "medium") take(std::ldexp(1.0, -8), "float32_matmul_precision=medium (bfloat16 matmuls)");
    if (get("tf32_matmul") == "1" || precision == "high") take(std::ldexp(1.0, -11), "TF32 matmuls");
    else if (get("tf32_cudnn") == "1") take(std::ldexp(1.0, -11), "TF32 convolutions");
  }
  // Autocast computes matmuls in its dtype; a wider tap still carries that rounding.
  const double own = dtype == "float32" ? std::ldexp(1.0, -24) : roundoff_of(dtype);
  for (const auto& [key, applies] : {std::pair{"autocast_cuda", cuda}, std::pair{"autocast_cpu", cpu}}) {
    const std::string a = get(key);
    if (!applies || a.empty() || a == "off") continue;
    const double u = roundoff_of(a);
    if (u > own) take(u, "autocast " + a);
  }
  return r;
}

}  // namespace dc
