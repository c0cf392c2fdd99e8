// GELU, tanh form (y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))), over
// contiguous values: the elementwise loop of a DiT block's MLP, as large as
// its widest activation, run by every sharded step. Private to reference/.
#pragma once
#include <cstddef>

namespace dc::ref {

// AVX2+FMA through SLEEF's 1-ulp tanh where the CPU has them, std::tanh
// otherwise. The arithmetic around tanh is the same in both, in T, operation
// by operation (no contraction), so they differ only in tanh's last bit.
void gelu_tanh_values(const float* x, float* y, std::size_t n);
void gelu_tanh_values(const double* x, double* y, std::size_t n);

// The two builds, for the tests that hold one to the other.
void gelu_tanh_values_portable(const float* x, float* y, std::size_t n);
void gelu_tanh_values_portable(const double* x, double* y, std::size_t n);
bool gelu_tanh_vectorised_available();
void gelu_tanh_values_avx2(const float* x, float* y, std::size_t n);
void gelu_tanh_values_avx2(const double* x, double* y, std::size_t n);

}  // namespace dc::ref
