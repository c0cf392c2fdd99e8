// Normalisations over the last dimension.
#pragma once
#include "harness/core/tensor.h"

namespace dc::ref {

// (x - mean) / sqrt(var + eps), no affine parameters; statistics in double.
template <class T>
BasicTensor<T> layer_norm(const BasicTensor<T>& x, double eps);

// x / sqrt(mean(x^2) + eps) * weight, weight has the size of the last dimension.
template <class T>
BasicTensor<T> rms_norm(const BasicTensor<T>& x, const BasicTensor<T>& weight, double eps);
// The same in float64 with a float32 weight (widened exactly).
RefTensor rms_norm(const RefTensor& x, const Tensor& weight, double eps);

}  // namespace dc::ref
