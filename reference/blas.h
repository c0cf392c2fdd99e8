// OpenBLAS, loaded the first time a GEMM is wanted rather than when the
// program starts. Its pthread build starts its worker threads as it loads, and
// it brings libgfortran along: 1.4-1.9 ms of every start on a 2-core VM
// (paired `perf stat` of an empty program linked with and without it), a
// tenth of a `diffcheck compare` of 512 MB, which does no linear algebra.
// Row-major GEMMs only, as the reference uses them.
#pragma once

namespace dc::ref::blas {

// c = alpha op(a) op(b) + beta c, op transposing when asked. Throws Error
// when OpenBLAS cannot be loaded.
void sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
           int ldb, float beta, float* c, int ldc);
void dgemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a, int lda,
           const double* b, int ldb, double beta, double* c, int ldc);

// OpenBLAS's threads: set now when it is loaded, else when it loads. One
// thread also stops its idle workers (they spin on sched_yield for about
// 0.1 s before they sleep).
void set_threads(int n);

}  // namespace dc::ref::blas
