// Single-rank math shared by scenarios and references. Templated on the
// element type: float for sharded runs, double for references. Kernels that
// produce a tensor of the run's dtype are followed by dc::round_to() in the
// scenario (bfloat16 emulation), not here.
#pragma once
#include <functional>

#include "harness/core/tensor.h"

namespace dc::ref {

// y[n,m] = x[n,k] · W[m,k]ᵀ + b[m] (PyTorch's Linear layout). b may be empty.
// Runs through BLAS (sgemm / dgemm).
template <class T>
BasicTensor<T> linear(const BasicTensor<T>& x, const BasicTensor<T>& w, const BasicTensor<T>& b);
// The same in float64 with float32 weights (exact values: widening is exact):
// the weight is widened a block of rows (output features) at a time into one
// reused buffer, each block a dgemm into its columns of y, so a float64 copy
// of a large weight never exists whole.
RefTensor linear(const RefTensor& x, const Tensor& w, const Tensor& b);
// The same product for a weight too big to hold at once: its [m, k] rows
// (output features) come from w_rows(r0, r1) a block at a time, in the blocks
// `linear` takes (multiples of 64 rows), so the two give the same bits. W is
// T, or float under a double x (widened as above).
template <class T, class W>
BasicTensor<T> linear_by_rows(const BasicTensor<T>& x, std::size_t m,
                              const std::function<BasicTensor<W>(std::size_t, std::size_t)>& w_rows,
                              const BasicTensor<W>& b);

// y[m,n] = a[k,m]ᵀ · b[k,n]: a contraction over the leading dimension (einsum
// 'km,kn->mn'), through BLAS.
template <class T>
BasicTensor<T> matmul_tn(const BasicTensor<T>& a, const BasicTensor<T>& b);

// y[m,n] = a[m,k] · b[k,n], through BLAS.
template <class T>
BasicTensor<T> matmul_nn(const BasicTensor<T>& a, const BasicTensor<T>& b);

// c[m,n] = a[m,k] · b (b[k,n], or b[n,k]ᵀ when b_transposed), row-major with
// leading dimensions: a head of a [tokens, heads, D] tensor is a strided view
// (pointer at column h*D, leading dimension heads*D), so attention needs no
// per-head copies. Through BLAS, counted as work (core/work_counter.h).
template <class T>
void gemm_strided(bool b_transposed, std::size_t m, std::size_t n, std::size_t k, const T* a, std::size_t lda,
                  const T* b, std::size_t ldb, T* c, std::size_t ldc);

template <class T>
BasicTensor<T> silu(const BasicTensor<T>& x);
template <class T>
BasicTensor<T> gelu_tanh(const BasicTensor<T>& x);
// The same in x's own memory (an activation no longer needed as it was: at
// flux1-dev size the MLP's is 113 MB per rank in the float64 reference).
template <class T>
BasicTensor<T> gelu_tanh(BasicTensor<T>&& x);
template <class T>
BasicTensor<T> add(const BasicTensor<T>& a, const BasicTensor<T>& b);

template <class T>
BasicTensor<T> cast(const BasicTensor<double>& x);
template <class T>
RefTensor to_ref(const BasicTensor<T>& x);

// Each BLAS call uses this many threads; one per rank when ranks outnumber cores.
void set_blas_threads(int n);

// This process's GEMM rate in GFLOP/s (square GEMMs of a size BLAS runs near
// its peak, repeated for about `seconds`), float32 or float64: the yardstick
// of a run's --profile. Not counted as work (core/work_counter.h).
double gemm_rate(bool float64, double seconds);

}  // namespace dc::ref
