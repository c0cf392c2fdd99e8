// Compiled with -mavx2 -mfma -ffp-contract=off (reference/CMakeLists.txt) and
// called only when the CPU has both (gelu.cpp checks at run time). Every
// operation is the one the portable loop does, in the same order; the tail
// goes through the same vector code on a padded copy, so a value's result
// does not depend on where it sits.
#include <immintrin.h>
#include <sleef.h>

#include <algorithm>
#include <cmath>

#include "reference/gelu.h"

namespace dc::ref {

void gelu_tanh_values_avx2(const float* x, float* y, std::size_t n) {
  const __m256 c = _mm256_set1_ps(static_cast<float>(std::sqrt(2.0 / M_PI))), a = _mm256_set1_ps(0.044715f);
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  auto eight = [&](const float* in, float* out) {
    const __m256 v = _mm256_loadu_ps(in);
    const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(a, v), v), v);
    const __m256 t = Sleef_tanhf8_u10avx2(_mm256_mul_ps(c, _mm256_add_ps(v, cube)));
    _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, t)));
  };
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) eight(x + i, y + i);
  if (i < n) {
    float in[8] = {}, out[8];
    std::copy(x + i, x + n, in);
    eight(in, out);
    std::copy(out, out + (n - i), y + i);
  }
}

void gelu_tanh_values_avx2(const double* x, double* y, std::size_t n) {
  const __m256d c = _mm256_set1_pd(std::sqrt(2.0 / M_PI)), a = _mm256_set1_pd(0.044715);
  const __m256d half = _mm256_set1_pd(0.5), one = _mm256_set1_pd(1.0);
  auto four = [&](const double* in, double* out) {
    const __m256d v = _mm256_loadu_pd(in);
    const __m256d cube = _mm256_mul_pd(_mm256_mul_pd(_mm256_mul_pd(a, v), v), v);
    const __m256d t = Sleef_tanhd4_u10avx2(_mm256_mul_pd(c, _mm256_add_pd(v, cube)));
    _mm256_storeu_pd(out, _mm256_mul_pd(_mm256_mul_pd(half, v), _mm256_add_pd(one, t)));
  };
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) four(x + i, y + i);
  if (i < n) {
    double in[4] = {}, out[4];
    std::copy(x + i, x + n, in);
    four(in, out);
    std::copy(out, out + (n - i), y + i);
  }
}

}  // namespace dc::ref
