#include "reference/nn.h"
#include "reference/gelu.h"

#include <chrono>
#include <cmath>
#include <type_traits>
#include <xtensor/xadapt.hpp>
#include <xtensor/xmath.hpp>

#include "harness/core/error.h"
#include "harness/core/work_counter.h"
#include "reference/blas.h"

namespace dc::ref {
namespace {

template <class T>
auto view(const BasicTensor<T>& t) {
  return xt::adapt(t.data.data(), t.data.size(), xt::no_ownership(), std::vector<std::size_t>{t.data.size()});
}

void gemm_tn(std::size_t m, std::size_t n, std::size_t k, const float* a, const float* b, float* y) {
  blas::sgemm(true, false, int(m), int(n), int(k), 1.0f, a, int(m), b, int(n), 0.0f, y, int(n));
  work::add_gemm_flops(2.0 * double(n) * double(m) * double(k), false);
}
void gemm_tn(std::size_t m, std::size_t n, std::size_t k, const double* a, const double* b, double* y) {
  blas::dgemm(true, false, int(m), int(n), int(k), 1.0, a, int(m), b, int(n), 0.0, y, int(n));
  work::add_gemm_flops(2.0 * double(n) * double(m) * double(k), true);
}

}  // namespace

template <class T>
BasicTensor<T> matmul_nn(const BasicTensor<T>& a, const BasicTensor<T>& b) {
  if (a.rank() != 2 || b.rank() != 2 || a.shape[1] != b.shape[0])
    fail("matmul_nn: {} and {} do not chain", shape_str(a.shape), shape_str(b.shape));
  const std::size_t m = a.shape[0], k = a.shape[1], n = b.shape[1];
  BasicTensor<T> y({m, n});
  if (k) gemm_strided<T>(false, m, n, k, a.ptr(), k, b.ptr(), n, y.ptr(), n);
  return y;
}

template <class T>
BasicTensor<T> matmul_tn(const BasicTensor<T>& a, const BasicTensor<T>& b) {
  if (a.rank() != 2 || b.rank() != 2 || a.shape[0] != b.shape[0])
    fail("matmul_tn: {} and {} do not share a leading dimension", shape_str(a.shape), shape_str(b.shape));
  const std::size_t k = a.shape[0], m = a.shape[1], n = b.shape[1];
  BasicTensor<T> y({m, n});
  if (m && n && k) gemm_tn(m, n, k, a.ptr(), b.ptr(), y.ptr());
  return y;
}

template <class T>
void gemm_strided(bool b_transposed, std::size_t m, std::size_t n, std::size_t k, const T* a, std::size_t lda,
                  const T* b, std::size_t ldb, T* c, std::size_t ldc) {
  if (!m || !n) return;
  if constexpr (std::is_same_v<T, float>)
    blas::sgemm(false, b_transposed, int(m), int(n), int(k), 1.0f, a, int(lda), b, int(ldb), 0.0f, c, int(ldc));
  else
    blas::dgemm(false, b_transposed, int(m), int(n), int(k), 1.0, a, int(lda), b, int(ldb), 0.0, c, int(ldc));
  work::add_gemm_flops(2.0 * double(n) * double(m) * double(k), std::is_same_v<T, double>);
}

void set_blas_threads(int n) { blas::set_threads(n); }

double gemm_rate(bool float64, double seconds) {
  constexpr int n = 768;
  const auto run = [&](auto zero) {
    using T = decltype(zero);
    std::vector<T> a(std::size_t(n) * n, T(0.5)), b(a), c(a.size());
    const auto t0 = std::chrono::steady_clock::now();
    int calls = 0;
    double elapsed = 0;
    do {
      if constexpr (std::is_same_v<T, float>)
        blas::sgemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
      else
        blas::dgemm(false, false, n, n, n, 1.0, a.data(), n, b.data(), n, 0.0, c.data(), n);
      ++calls;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (elapsed < seconds || calls < 2);
    return 2.0 * n * n * double(n) * calls / elapsed / 1e9;
  };
  return float64 ? run(0.0) : run(0.0f);
}

namespace {

// The shape of y = x · wᵀ + b, after checking that x, w and b (of `b_size`
// values; 0: no bias) fit.
Shape linear_output_shape(const Shape& x, const Shape& w, const Shape& b, std::size_t b_size) {
  if (w.size() != 2 || x.empty() || x.back() != w[1])
    fail("linear: input {} does not match weight {} (expected [..., {}])", shape_str(x), shape_str(w),
         w.size() == 2 ? w[1] : 0);
  if (b_size != 0 && b_size != w[0])
    fail("linear: bias {} does not match weight {}", shape_str(b), shape_str(w));
  Shape out = x;
  out.back() = w[0];
  return out;
}

}  // namespace

template <class T>
BasicTensor<T> linear(const BasicTensor<T>& x, const BasicTensor<T>& w, const BasicTensor<T>& b) {
  const Shape out_shape = linear_output_shape(x.shape, w.shape, b.shape, b.size());
  const std::size_t k = w.shape[1], m = w.shape[0], n = x.size() / k;
  BasicTensor<T> y(out_shape);
  if (k) gemm_strided<T>(true, n, m, k, x.ptr(), k, w.ptr(), k, y.ptr(), m);
  if (b.size())
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < m; ++j) y.data[i * m + j] += b.data[j];
  return y;
}

namespace {

// Rows of a weight per block of a blockwise product: about 64 MiB of float64,
// at least 256, a multiple of 64 (so ranks that share out a block's
// generation split it evenly). BLAS packs all of x again for every gemm (its
// n x k panel: x is the operand it reuses across the block's rows), at memory
// speed, against 2 x rows flops per packed value: with 4 MiB blocks (64-170
// rows at flux1-dev size) that packing took 5% of a first run's samples.
std::size_t block_rows(std::size_t m, std::size_t k) {
  std::size_t rows = std::max<std::size_t>(256, (std::size_t{64} << 20) / (8 * std::max<std::size_t>(k, 1)));
  return std::min(m, rows - rows % 64);
}

// y[n, m] = x[n, k] · Wᵀ (+ b), W's rows [r0, r0 + rows) at rows_at(r0, rows)
// (of type W, widened to T into one reused buffer when they differ), each
// block a gemm into its columns of y.
template <class T, class W, class RowsAt>
BasicTensor<T> blockwise_linear(const BasicTensor<T>& x, std::size_t m, std::size_t k, const BasicTensor<W>& b,
                                RowsAt&& rows_at) {
  const Shape out_shape = linear_output_shape(x.shape, {m, k}, b.shape, b.size());
  const std::size_t n = x.size() / std::max<std::size_t>(k, 1), block = block_rows(m, k);
  BasicTensor<T> y(out_shape);
  std::vector<T> wide(std::is_same_v<T, W> ? 0 : block * k);
  for (std::size_t r0 = 0; r0 < m && k; r0 += block) {
    const std::size_t rows = std::min(block, m - r0);
    const W* w = rows_at(r0, rows);
    const T* rows_t;
    if constexpr (std::is_same_v<T, W>) {
      rows_t = w;
    } else {
      std::copy(w, w + rows * k, wide.begin());
      rows_t = wide.data();
    }
    gemm_strided<T>(true, n, rows, k, x.ptr(), k, rows_t, k, y.ptr() + r0, m);
  }
  if (b.size())
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < m; ++j) y.data[i * m + j] += static_cast<T>(b.data[j]);
  return y;
}

}  // namespace

RefTensor linear(const RefTensor& x, const Tensor& w, const Tensor& b) {
  linear_output_shape(x.shape, w.shape, b.shape, b.size());
  const std::size_t k = w.shape[1];
  return blockwise_linear(x, w.shape[0], k, b, [&](std::size_t r0, std::size_t) { return w.ptr() + r0 * k; });
}

template <class T, class W>
BasicTensor<T> linear_by_rows(const BasicTensor<T>& x, std::size_t m,
                              const std::function<BasicTensor<W>(std::size_t, std::size_t)>& w_rows,
                              const BasicTensor<W>& b) {
  const std::size_t k = x.shape.empty() ? 0 : x.shape.back();
  BasicTensor<W> held;  // the block being multiplied; the next one takes its memory
  return blockwise_linear(x, m, k, b, [&](std::size_t r0, std::size_t rows) {
    held = {};
    held = w_rows(r0, r0 + rows);
    if (held.shape != Shape{rows, k})
      fail("linear_by_rows: rows [{}, {}) of a [{}, {}] weight came as {}", r0, r0 + rows, m, k, shape_str(held.shape));
    return held.ptr();
  });
}
template BasicTensor<float> linear_by_rows(const BasicTensor<float>&, std::size_t,
                                           const std::function<BasicTensor<float>(std::size_t, std::size_t)>&,
                                           const BasicTensor<float>&);
template BasicTensor<double> linear_by_rows(const BasicTensor<double>&, std::size_t,
                                            const std::function<BasicTensor<double>(std::size_t, std::size_t)>&,
                                            const BasicTensor<double>&);
template BasicTensor<double> linear_by_rows(const BasicTensor<double>&, std::size_t,
                                            const std::function<BasicTensor<float>(std::size_t, std::size_t)>&,
                                            const BasicTensor<float>&);

template <class T>
BasicTensor<T> silu(const BasicTensor<T>& x) {
  BasicTensor<T> y(x.shape);
  auto xv = view(x);
  auto yv = xt::adapt(y.data.data(), y.size(), xt::no_ownership(), std::vector<std::size_t>{y.size()});
  yv = xv / (T(1) + xt::exp(-xv));
  return y;
}

template <class T>
BasicTensor<T> gelu_tanh(BasicTensor<T>&& x) {
  BasicTensor<T> y = std::move(x);
  gelu_tanh_values(y.ptr(), y.ptr(), y.size());  // elementwise: each value read before it is written
  return y;
}

template <class T>
BasicTensor<T> gelu_tanh(const BasicTensor<T>& x) {
  BasicTensor<T> y(x.shape);
  gelu_tanh_values(x.ptr(), y.ptr(), x.size());
  return y;
}

template <class T>
BasicTensor<T> add(const BasicTensor<T>& a, const BasicTensor<T>& b) {
  if (a.shape != b.shape) fail("add: shapes {} and {} differ", shape_str(a.shape), shape_str(b.shape));
  BasicTensor<T> y(a.shape);
  for (std::size_t i = 0; i < a.size(); ++i) y.data[i] = a.data[i] + b.data[i];
  return y;
}

template <class T>
BasicTensor<T> cast(const BasicTensor<double>& x) {
  return BasicTensor<T>(x.shape, std::vector<T>(x.data.begin(), x.data.end()));
}

template <class T>
RefTensor to_ref(const BasicTensor<T>& x) {
  return RefTensor(x.shape, std::vector<double>(x.data.begin(), x.data.end()));
}

#define DC_INSTANTIATE(T)                                                                      \
  template BasicTensor<T> linear(const BasicTensor<T>&, const BasicTensor<T>&, const BasicTensor<T>&); \
  template BasicTensor<T> matmul_tn(const BasicTensor<T>&, const BasicTensor<T>&);            \
  template BasicTensor<T> matmul_nn(const BasicTensor<T>&, const BasicTensor<T>&);            \
  template BasicTensor<T> silu(const BasicTensor<T>&);                                         \
  template BasicTensor<T> gelu_tanh(const BasicTensor<T>&);                                    \
  template BasicTensor<T> gelu_tanh(BasicTensor<T>&&);                                         \
  template BasicTensor<T> add(const BasicTensor<T>&, const BasicTensor<T>&);                   \
  template BasicTensor<T> cast<T>(const BasicTensor<double>&);                                 \
  template RefTensor to_ref(const BasicTensor<T>&);                                            \
  template void gemm_strided(bool, std::size_t, std::size_t, std::size_t, const T*, std::size_t, const T*,  \
                             std::size_t, T*, std::size_t);
DC_INSTANTIATE(float)
DC_INSTANTIATE(double)
#undef DC_INSTANTIATE

}  // namespace dc::ref
