#include "reference/generate.h"

#include <Random123/philox.h>

#include "harness/core/error.h"
#include "harness/core/perturbation.h"

namespace dc::ref {

std::uint32_t tensor_id(const std::string& name) {
  std::uint32_t h = 2166136261u;
  for (unsigned char c : name) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

float uniform_at(std::uint64_t seed, std::uint32_t id, std::uint64_t index, float scale) {
  r123::Philox4x32 rng;
  r123::Philox4x32::key_type key = {{static_cast<std::uint32_t>(seed ^ (seed >> 32)), id}};
  r123::Philox4x32::ctr_type ctr = {{static_cast<std::uint32_t>(index),
                                     static_cast<std::uint32_t>(index >> 32), 0x64636b21u, 0}};
  auto out = rng(ctr, key);
  // 24 random bits -> [0,1) exactly representable in float, then to [-1,1).
  float u = static_cast<float>(out[0] >> 8) * (1.0f / 16777216.0f);
  return (2.0f * u - 1.0f) * scale;
}

void uniform_run_portable(std::uint64_t seed, std::uint32_t id, std::uint64_t first, std::size_t n, float scale,
                          float* out) {
  for (std::size_t i = 0; i < n; ++i) out[i] = uniform_at(seed, id, first + i, scale);
}

bool uniform_run_vectorised_available() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool ok = __builtin_cpu_supports("avx2");
  return ok;
#else
  return false;
#endif
}

void uniform_run(std::uint64_t seed, std::uint32_t id, std::uint64_t first, std::size_t n, float scale, float* out) {
  if (uniform_run_vectorised_available()) return uniform_run_avx2(seed, id, first, n, scale, out);
  uniform_run_portable(seed, id, first, n, scale, out);
}

Tensor generate(std::uint64_t seed, const std::string& name, const Shape& global, float scale,
                const Ranges& block) {
  Ranges r = block;
  if (r.empty())
    for (auto d : global) r.emplace_back(0, d);
  if (r.size() != global.size()) fail("generate '{}': {} ranges for a {}-d tensor", name, r.size(), global.size());
  Shape local;
  for (std::size_t d = 0; d < r.size(); ++d) {
    if (r[d].first > r[d].second || r[d].second > global[d])
      fail("generate '{}': range [{},{}) outside dimension {} of size {}", name, r[d].first,
           r[d].second, d, global[d]);
    local.push_back(r[d].second - r[d].first);
  }
  Tensor t(local);
  const auto id = tensor_id(name);
  const InputPerturbation* perturb = active_input_perturbation();
  if (t.size() == 0) return t;
  if (local.empty()) {  // a scalar: global index 0
    t.data[0] = uniform_at(seed, id, 0, scale);
    if (perturb) t.data[0] = perturb_value(*perturb, id, 0, t.data[0]);
    return t;
  }
  // One row of the last dimension at a time: consecutive global indices.
  const auto gstr = strides_of(global);
  const std::size_t lead = local.size() - 1, row = local.back();
  std::vector<std::size_t> idx(lead, 0);  // odometer over the leading dimensions
  for (float* out = t.data.data(); out < t.data.data() + t.size(); out += row) {
    std::size_t g = r.back().first;
    for (std::size_t d = 0; d < lead; ++d) g += (r[d].first + idx[d]) * gstr[d];
    uniform_run(seed, id, g, row, scale, out);
    if (perturb)
      for (std::size_t j = 0; j < row; ++j) out[j] = perturb_value(*perturb, id, g + j, out[j]);
    for (std::size_t d = lead; d-- > 0;) {
      if (++idx[d] < local[d]) break;
      idx[d] = 0;
    }
  }
  return t;
}

RefTensor generate_ref(std::uint64_t seed, const std::string& name, const Shape& global,
                       float scale) {
  Tensor t = generate(seed, name, global, scale);
  return RefTensor(t.shape, std::vector<double>(t.data.begin(), t.data.end()));
}

}  // namespace dc::ref
