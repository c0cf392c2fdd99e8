// Scaled dot-product attention, exact softmax, per head through BLAS.
#pragma once
#include "harness/core/tensor.h"

namespace dc::ref {

// q: [Nq, heads, D], k and v: [Nk, heads, D] -> [Nq, heads, D];
// softmax(scale * q k^T) v for each head, no mask. Row sums in float64.
template <class T>
BasicTensor<T> attention(const BasicTensor<T>& q, const BasicTensor<T>& k, const BasicTensor<T>& v,
                         double scale);

}  // namespace dc::ref
