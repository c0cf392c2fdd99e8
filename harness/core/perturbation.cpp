#include "harness/core/perturbation.h"

#include <cmath>

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
  // One rounding unit, relative, of a size drawn from [u/2, 3u/2) and a random
  // sign, before the value is rounded to the dtype: most values (about four
  // in five) land on a neighbouring representable number, never further.
  const std::uint64_t r = splitmix64(p.seed ^ splitmix64((std::uint64_t{tensor_id} << 32) ^ index));
  const double u = p.dtype == DType::float32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -8);
  const double size = u * (0.5 + static_cast<double>(r >> 11) * 0x1.0p-53);
  const float moved = static_cast<float>(static_cast<double>(value) * (r & 1u ? 1.0 + size : 1.0 - size));
  return p.dtype == DType::float32 ? moved : round_bf16(moved);
}

ExactInputs::ExactInputs() { ++g_exact_depth; }
ExactInputs::~ExactInputs() { --g_exact_depth; }

}  // namespace dc
