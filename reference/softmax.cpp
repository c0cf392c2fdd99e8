#include "reference/softmax.h"

#include <algorithm>
#include <cmath>

#include "reference/cpu.h"

namespace dc::ref {
namespace {

template <class T>
void portable(T* s, std::size_t rows, std::size_t cols, double scale, double* sums) {
  for (std::size_t i = 0; i < rows; ++i) {
    T* row = s + i * cols;
    // A NaN may or may not win the max (as with max_pd); either way its own
    // exp is NaN, and so is the row's sum.
    const T k = static_cast<T>(scale);
    T m = -INFINITY;
    for (std::size_t j = 0; j < cols; ++j) m = std::max(m, k * row[j]);
    double sum = 0;
    for (std::size_t j = 0; j < cols; ++j) {
      row[j] = std::exp(k * row[j] - m);
      sum += row[j];
    }
    sums[i] = sum;
  }
}

}  // namespace

void exp_rows_portable(float* s, std::size_t rows, std::size_t cols, double scale, double* sums) {
  portable(s, rows, cols, scale, sums);
}
void exp_rows_portable(double* s, std::size_t rows, std::size_t cols, double scale, double* sums) {
  portable(s, rows, cols, scale, sums);
}
bool exp_rows_vectorised_available() { return avx2_fma_available(); }

void exp_rows(float* s, std::size_t rows, std::size_t cols, double scale, double* sums) {
  if (avx2_fma_available()) return exp_rows_avx2(s, rows, cols, scale, sums);
  portable(s, rows, cols, scale, sums);
}
void exp_rows(double* s, std::size_t rows, std::size_t cols, double scale, double* sums) {
  if (avx2_fma_available()) return exp_rows_avx2(s, rows, cols, scale, sums);
  portable(s, rows, cols, scale, sums);
}

}  // namespace dc::ref
