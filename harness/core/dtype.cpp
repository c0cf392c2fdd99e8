#include "harness/core/dtype.h"

#include "harness/core/error.h"

namespace dc {

DType parse_dtype(const std::string& s) {
  if (s == "float32") return DType::float32;
  if (s == "bfloat16") return DType::bfloat16;
  input_error("unknown dtype '{}': choose float32 or bfloat16", s);
}

std::string dtype_name(DType d) { return d == DType::bfloat16 ? "bfloat16" : "float32"; }

void round_to(DType d, std::span<float> xs) {
  if (d != DType::bfloat16) return;
  for (float& x : xs) x = round_bf16(x);
}

}  // namespace dc
