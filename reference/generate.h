// Counter-based generation of inputs and weights: element i of tensor `name`
// under `seed` is a pure function of (seed, name, global index i), computed
// with Random123's Philox4x32-10. Any rank can make any slice of any tensor
// without the full tensor, and the reference makes the same numbers.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "harness/core/dtype.h"
#include "harness/core/tensor.h"

namespace dc::ref {

// 32-bit FNV-1a of the tensor name: the second half of the Philox key.
std::uint32_t tensor_id(const std::string& name);

// Uniform in [-scale, scale), rounded to float (so float32 runs see exact values).
float uniform_at(std::uint64_t seed, std::uint32_t id, std::uint64_t index, float scale);
// uniform_at of indices first, first + 1, ..., first + n - 1, into out: eight
// at a time in AVX2 lanes where the CPU has AVX2 (the same bits).
void uniform_run(std::uint64_t seed, std::uint32_t id, std::uint64_t first, std::size_t n, float scale, float* out);
// The two builds, for the test that holds one to the other.
void uniform_run_portable(std::uint64_t seed, std::uint32_t id, std::uint64_t first, std::size_t n, float scale,
                          float* out);
void uniform_run_avx2(std::uint64_t seed, std::uint32_t id, std::uint64_t first, std::size_t n, float scale,
                      float* out);
bool uniform_run_vectorised_available();

// The block of the global tensor selected by [begin, end) per dimension.
using Ranges = std::vector<std::pair<std::size_t, std::size_t>>;
Tensor generate(std::uint64_t seed, const std::string& name, const Shape& global, float scale,
                const Ranges& block = {});
RefTensor generate_ref(std::uint64_t seed, const std::string& name, const Shape& global,
                       float scale);

// Generated values as element type T: rounded to the run's dtype when T is
// float (the sharded run's weights), left exact when T is double (the reference).
template <class T>
BasicTensor<T> as_run_values(Tensor t, DType dtype) {
  if constexpr (std::is_same_v<T, float>) {
    round_to(dtype, t.data);
    return t;
  } else {
    return BasicTensor<T>(t.shape, std::vector<T>(t.data.begin(), t.data.end()));
  }
}

}  // namespace dc::ref
