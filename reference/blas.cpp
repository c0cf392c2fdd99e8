#include "reference/blas.h"

#include <cblas.h>
#include <dlfcn.h>

#include <atomic>
#include <mutex>

#include "harness/core/error.h"

namespace dc::ref::blas {
namespace {

using Sgemm = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint, float,
                       const float*, blasint, const float*, blasint, float, float*, blasint);
using Dgemm = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint, double,
                       const double*, blasint, const double*, blasint, double, double*, blasint);
using SetThreads = void (*)(int);
using Shutdown = int (*)();

struct Api {
  Sgemm sgemm = nullptr;
  Dgemm dgemm = nullptr;
  SetThreads set_threads = nullptr;
  Shutdown shutdown = nullptr;  // absent from a build without a thread server
};

std::mutex mu;
Api api;
std::atomic<bool> ready{false};
int wanted_threads = 0;  // 0: as OpenBLAS chose (OPENBLAS_NUM_THREADS, else one per core)

void apply_threads(int n) {
  api.set_threads(n);
  if (n == 1 && api.shutdown) api.shutdown();
}

// The library the build found (its SONAME: every Debian variant of OpenBLAS,
// pthread, OpenMP or serial, answers to it), else the path CMake saw.
const Api& load() {
  if (ready.load(std::memory_order_acquire)) return api;
  std::lock_guard lock(mu);
  if (ready.load(std::memory_order_relaxed)) return api;
  void* h = dlopen(DIFFCHECK_BLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (!h) h = dlopen(DIFFCHECK_BLAS_PATH, RTLD_NOW | RTLD_LOCAL);
  if (!h) fail("cannot load OpenBLAS ({} or {}): {}", DIFFCHECK_BLAS_SONAME, DIFFCHECK_BLAS_PATH, dlerror());
  Api a;
  a.sgemm = reinterpret_cast<Sgemm>(dlsym(h, "cblas_sgemm"));
  a.dgemm = reinterpret_cast<Dgemm>(dlsym(h, "cblas_dgemm"));
  a.set_threads = reinterpret_cast<SetThreads>(dlsym(h, "openblas_set_num_threads"));
  a.shutdown = reinterpret_cast<Shutdown>(dlsym(h, "blas_thread_shutdown_"));
  if (!a.sgemm || !a.dgemm || !a.set_threads)
    fail("{} is not OpenBLAS: it lacks cblas_sgemm, cblas_dgemm or openblas_set_num_threads", DIFFCHECK_BLAS_SONAME);
  api = a;
  if (wanted_threads > 0) apply_threads(wanted_threads);
  ready.store(true, std::memory_order_release);
  return api;
}

CBLAS_TRANSPOSE op(bool t) { return t ? CblasTrans : CblasNoTrans; }

}  // namespace

void sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
           int ldb, float beta, float* c, int ldc) {
  load().sgemm(CblasRowMajor, op(trans_a), op(trans_b), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void dgemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a, int lda,
           const double* b, int ldb, double beta, double* c, int ldc) {
  load().dgemm(CblasRowMajor, op(trans_a), op(trans_b), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void set_threads(int n) {
  std::lock_guard lock(mu);
  wanted_threads = n;
  if (ready.load(std::memory_order_relaxed)) apply_threads(n);
}

}  // namespace dc::ref::blas
