#include "reference/gelu.h"

#include <cmath>

#include "reference/cpu.h"

namespace dc::ref {
namespace {

template <class T>
void portable(const T* x, T* y, std::size_t n) {
  const T c = static_cast<T>(std::sqrt(2.0 / M_PI)), a = static_cast<T>(0.044715);
  for (std::size_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T inner = v + a * v * v * v;
    y[i] = T(0.5) * v * (T(1) + std::tanh(c * inner));
  }
}

}  // namespace

void gelu_tanh_values_portable(const float* x, float* y, std::size_t n) { portable(x, y, n); }
void gelu_tanh_values_portable(const double* x, double* y, std::size_t n) { portable(x, y, n); }
bool gelu_tanh_vectorised_available() { return avx2_fma_available(); }

void gelu_tanh_values(const float* x, float* y, std::size_t n) {
  if (avx2_fma_available()) return gelu_tanh_values_avx2(x, y, n);
  portable(x, y, n);
}
void gelu_tanh_values(const double* x, double* y, std::size_t n) {
  if (avx2_fma_available()) return gelu_tanh_values_avx2(x, y, n);
  portable(x, y, n);
}

}  // namespace dc::ref
