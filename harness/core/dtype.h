// The compute dtype of a run. bfloat16 is emulated: values live in float and are
// rounded to the nearest bfloat16 (ties to even) after every op that yields one.
#pragma once
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

namespace dc {

enum class DType { float32, bfloat16 };

DType parse_dtype(const std::string& s);  // throws InputError naming the choices
std::string dtype_name(DType d);

inline float round_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) {  // Inf or NaN: keep, quiet the NaN
    if (u & 0x007fffffu) u |= 0x00400000u;
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  }
  u &= 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

// Round every element to the run dtype (no-op for float32).
void round_to(DType d, std::span<float> xs);

}  // namespace dc
