// The exponential pass of a softmax, vectorised: the one elementwise loop of
// attention whose cost grows with tokens squared (reference/attention.h, and
// the ring attention kernel of scenarios/ring_attention.h).
#pragma once
#include <cstddef>

namespace dc::ref {

// For each of `rows` rows of s (contiguous, `cols` long):
//   s[i, j] = exp(scale * s[i, j] - max_j(scale * s[i, j])),  sums[i] = sum_j s[i, j]
// (the sum accumulated in float64). A NaN anywhere in a row makes its sum NaN,
// so the row's output, divided by it, is NaN too: injected NaNs propagate.
// AVX2+FMA through SLEEF (1-ulp exp) where the CPU has them, std::exp
// otherwise; every element of a row goes through the same function, so a
// row's values do not depend on its length or alignment.
void exp_rows(float* s, std::size_t rows, std::size_t cols, double scale, double* sums);
void exp_rows(double* s, std::size_t rows, std::size_t cols, double scale, double* sums);

// The portable and the AVX2 versions, for the tests that hold one to the other.
void exp_rows_portable(float* s, std::size_t rows, std::size_t cols, double scale, double* sums);
void exp_rows_portable(double* s, std::size_t rows, std::size_t cols, double scale, double* sums);
bool exp_rows_vectorised_available();
void exp_rows_avx2(float* s, std::size_t rows, std::size_t cols, double scale, double* sums);
void exp_rows_avx2(double* s, std::size_t rows, std::size_t cols, double scale, double* sums);

}  // namespace dc::ref
