#include "reference/norms.h"

#include <cmath>

#include "harness/core/error.h"

namespace dc::ref {

template <class T>
BasicTensor<T> layer_norm(const BasicTensor<T>& x, double eps) {
  const std::size_t n = x.shape.back(), rows = x.size() / n;
  BasicTensor<T> y(x.shape);
  for (std::size_t r = 0; r < rows; ++r) {
    const T* p = x.ptr() + r * n;
    double mean = 0, var = 0;
    for (std::size_t i = 0; i < n; ++i) mean += p[i];
    mean /= static_cast<double>(n);
    for (std::size_t i = 0; i < n; ++i) var += (p[i] - mean) * (p[i] - mean);
    var /= static_cast<double>(n);
    const double inv = 1.0 / std::sqrt(var + eps);
    for (std::size_t i = 0; i < n; ++i) y.data[r * n + i] = static_cast<T>((p[i] - mean) * inv);
  }
  return y;
}

template <class T>
BasicTensor<T> rms_norm(const BasicTensor<T>& x, const BasicTensor<T>& weight, double eps) {
  const std::size_t n = x.shape.back(), rows = x.size() / n;
  if (weight.size() != n) fail("rms_norm: weight {} for last dimension {}", shape_str(weight.shape), n);
  BasicTensor<T> y(x.shape);
  for (std::size_t r = 0; r < rows; ++r) {
    const T* p = x.ptr() + r * n;
    double ms = 0;
    for (std::size_t i = 0; i < n; ++i) ms += static_cast<double>(p[i]) * p[i];
    const double inv = 1.0 / std::sqrt(ms / static_cast<double>(n) + eps);
    for (std::size_t i = 0; i < n; ++i) y.data[r * n + i] = static_cast<T>(p[i] * inv * weight.data[i]);
  }
  return y;
}

RefTensor rms_norm(const RefTensor& x, const Tensor& weight, double eps) {
  return rms_norm(x, RefTensor(weight.shape, std::vector<double>(weight.data.begin(), weight.data.end())), eps);
}

template BasicTensor<float> layer_norm(const BasicTensor<float>&, double);
template BasicTensor<double> layer_norm(const BasicTensor<double>&, double);
template BasicTensor<float> rms_norm(const BasicTensor<float>&, const BasicTensor<float>&, double);
template BasicTensor<double> rms_norm(const BasicTensor<double>&, const BasicTensor<double>&, double);

}  // namespace dc::ref
