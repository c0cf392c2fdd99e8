// The math a run did beyond its tensors' dtype, from the root attribute
// `math` (docs/FORMAT.md, written by diffcheck.torch): TF32 matmuls, the
// float32 matmul precision, autocast. A float32 tap whose matmuls ran in TF32
// carries 10-bit mantissas' rounding (2^-11), one under bfloat16 autocast
// bfloat16's (2^-8): the derived rule must hold it to that, not to float32's.
#pragma once
#include <string>

namespace dc {

struct MathRounding {
  double roundoff = 0;  // unit roundoff the math adds to a tap of this dtype; 0: none beyond the dtype
  std::string label;    // "TF32 matmuls", "autocast bfloat16", ...; empty when roundoff is 0
};

// What `math` (the root attribute's text; empty when absent) adds to a tap
// stored as `dtype`. `device=cpu` in it drops the CUDA-only settings (TF32,
// the matmul precision, CUDA autocast), `device=cuda` the CPU autocast.
// Throws InputError on text that is not `name=value` pairs.
MathRounding math_rounding(const std::string& math, const std::string& dtype, const std::string& where);

}  // namespace dc
