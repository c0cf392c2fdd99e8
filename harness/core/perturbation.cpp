#include "harness/core/perturbation.h"

#include <cmath>
#include <cstring>

namespace dc {
namespace {
std::optional<InputPerturbation> g_perturbation;
int g_exact_depth = 0;

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

void set_input_perturbation(std::optional<InputPerturbation> p) { g_perturbation = p; }

const InputPerturbation* active_input_perturbation() {
  return g_perturbation && g_exact_depth == 0 ? &*g_perturbation : nullptr;
}

float perturb_value(const InputPerturbation& p, std::uint32_t tensor_id, std::uint64_t index, float value) {
  if (value == 0.0f || !std::isfinite(value)) return value;
  const bool up = splitmix64(p.seed ^ splitmix64((std::uint64_t{tensor_id} << 32) ^ index)) & 1u;
  if (p.dtype == DType::float32) return std::nextafter(value, (value > 0) == up ? INFINITY : -INFINITY);
  // bfloat16: the rounded value's upper 16 bits, one step in magnitude.
  const float r = round_bf16(value);
  std::uint32_t u;
  std::memcpy(&u, &r, 4);
  if ((u & 0x7fff0000u) == 0 || (u & 0x7f800000u) == 0x7f800000u) return r;
  u = up ? u + 0x10000u : u - 0x10000u;
  float out;
  std::memcpy(&out, &u, 4);
  return std::isfinite(out) ? out : r;
}

ExactInputs::ExactInputs() { ++g_exact_depth; }
ExactInputs::~ExactInputs() { --g_exact_depth; }

}  // namespace dc
