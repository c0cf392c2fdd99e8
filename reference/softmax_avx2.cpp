// Compiled with -mavx2 -mfma (reference/CMakeLists.txt) and called only when
// the CPU has both (softmax.cpp checks at run time).
#include <immintrin.h>
#include <sleef.h>

#include <algorithm>
#include <cmath>

#include "reference/softmax.h"

namespace dc::ref {
namespace {

// Lanes [0, n) of a 4- or 8-wide vector: the mask of a row's tail.
__m256i tail_mask(std::size_t n, std::size_t lanes) {
  alignas(32) int m[8] = {};
  for (std::size_t i = 0; i < n; ++i)
    if (lanes == 8) {
      m[i] = -1;
    } else {
      m[2 * i] = m[2 * i + 1] = -1;
    }
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(m));
}

double horizontal_sum(__m256d v) {
  alignas(32) double a[4];
  _mm256_store_pd(a, v);
  return (a[0] + a[1]) + (a[2] + a[3]);
}

}  // namespace

void exp_rows_avx2(double* s, std::size_t rows, std::size_t cols, double scale, double* sums) {
  const std::size_t full = cols / 4 * 4;
  const __m256i tail = tail_mask(cols - full, 4);
  const __m256d k = _mm256_set1_pd(scale);
  for (std::size_t i = 0; i < rows; ++i) {
    double* row = s + i * cols;
    __m256d m = _mm256_set1_pd(-INFINITY);
    for (std::size_t j = 0; j < full; j += 4) m = _mm256_max_pd(m, _mm256_mul_pd(k, _mm256_loadu_pd(row + j)));
    if (full < cols) {
      // Masked-off lanes load 0; keep -inf there so they never win the max.
      const __m256d x = _mm256_mul_pd(k, _mm256_maskload_pd(row + full, tail));
      m = _mm256_max_pd(m, _mm256_blendv_pd(_mm256_set1_pd(-INFINITY), x, _mm256_castsi256_pd(tail)));
    }
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, m);
    double top = lanes[0];
    for (double l : lanes) top = std::max(top, l);
    const __m256d mv = _mm256_set1_pd(top);
    __m256d acc = _mm256_setzero_pd();
    for (std::size_t j = 0; j < full; j += 4) {
      const __m256d e = Sleef_expd4_u10avx2(_mm256_sub_pd(_mm256_mul_pd(k, _mm256_loadu_pd(row + j)), mv));
      _mm256_storeu_pd(row + j, e);
      acc = _mm256_add_pd(acc, e);
    }
    if (full < cols) {
      const __m256d e =
          Sleef_expd4_u10avx2(_mm256_sub_pd(_mm256_mul_pd(k, _mm256_maskload_pd(row + full, tail)), mv));
      _mm256_maskstore_pd(row + full, tail, e);
      acc = _mm256_add_pd(acc, _mm256_and_pd(e, _mm256_castsi256_pd(tail)));
    }
    sums[i] = horizontal_sum(acc);
  }
}

void exp_rows_avx2(float* s, std::size_t rows, std::size_t cols, double scale, double* sums) {
  const std::size_t full = cols / 8 * 8;
  const __m256i tail = tail_mask(cols - full, 8);
  const __m256 k = _mm256_set1_ps(static_cast<float>(scale));
  for (std::size_t i = 0; i < rows; ++i) {
    float* row = s + i * cols;
    __m256 m = _mm256_set1_ps(-INFINITY);
    for (std::size_t j = 0; j < full; j += 8) m = _mm256_max_ps(m, _mm256_mul_ps(k, _mm256_loadu_ps(row + j)));
    if (full < cols) {
      const __m256 x = _mm256_mul_ps(k, _mm256_maskload_ps(row + full, tail));
      m = _mm256_max_ps(m, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x, _mm256_castsi256_ps(tail)));
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m);
    float top = lanes[0];
    for (float l : lanes) top = std::max(top, l);
    const __m256 mv = _mm256_set1_ps(top);
    __m256d acc = _mm256_setzero_pd();
    const auto add = [&](__m256 e) {
      acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
      acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    };
    for (std::size_t j = 0; j < full; j += 8) {
      const __m256 e = Sleef_expf8_u10avx2(_mm256_sub_ps(_mm256_mul_ps(k, _mm256_loadu_ps(row + j)), mv));
      _mm256_storeu_ps(row + j, e);
      add(e);
    }
    if (full < cols) {
      const __m256 e =
          Sleef_expf8_u10avx2(_mm256_sub_ps(_mm256_mul_ps(k, _mm256_maskload_ps(row + full, tail)), mv));
      _mm256_maskstore_ps(row + full, tail, e);
      add(_mm256_and_ps(e, _mm256_castsi256_ps(tail)));
    }
    sums[i] = horizontal_sum(acc);
  }
}

}  // namespace dc::ref
