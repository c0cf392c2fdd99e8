// Rotary position embedding as FLUX applies it: per-axis frequencies
// theta_k = base^(-2k/dim_axis) concatenated over the position axes, each
// repeated twice (interleaved), and pairs (x[2i], x[2i+1]) rotated.
#pragma once
#include <vector>

#include "harness/core/tensor.h"

namespace dc::ref {

struct RopeTable {
  RefTensor cos, sin;  // [N, D], in float64
};

// positions: N rows of one position per axis; axes_dim sums to D.
RopeTable rope_table(const std::vector<std::vector<double>>& positions,
                     const std::vector<int>& axes_dim, double base = 10000.0);

// x: [..., N, heads, D] with N matching the table; out = x*cos + rot(x)*sin,
// rot(x)[2i] = -x[2i+1], rot(x)[2i+1] = x[2i].
template <class T>
BasicTensor<T> apply_rope(const BasicTensor<T>& x, const RopeTable& t);

}  // namespace dc::ref
