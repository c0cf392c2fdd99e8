// GEMM efficiency of the flux_tp block's linears: each Linear the block runs
// on one tp rank (ref::linear: sgemm + bias) against a plain cblas_sgemm of
// the same shape, single-threaded, best of several repetitions.
//
//   build/bench_linears [default|flux1-dev] [tp]
#include <cblas.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "reference/flux_block.h"
#include "reference/generate.h"
#include "reference/nn.h"

using namespace dc;

namespace {

template <class F>
double best_seconds(F&& f, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string size = argc > 1 ? argv[1] : "default";
  const std::size_t tp = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 4;
  ref::set_blas_threads(1);
  const auto z = ref::FluxSizes::preset(size);
  const std::size_t n = z.tokens(), d = z.dim, m = z.mlp;
  struct Shape3 { const char* name; std::size_t out, in; };
  const std::vector<Shape3> linears = {{"q/k/v (each)", d / tp, d},
                                       {"proj_mlp", m / tp, d},
                                       {"proj_out (packed)", d, d / tp + m / tp}};
  const int reps = size == "flux1-dev" ? 3 : 20;
  fmt::print("flux_tp linears, size {}, tp={}, N={} tokens, 1 BLAS thread\n", size, tp, n);
  fmt::print("| linear | shape (N x in -> out) | block GFLOP/s | plain sgemm GFLOP/s | efficiency |\n");
  fmt::print("|---|---|---|---|---|\n");
  double total_block = 0, total_plain = 0, total_flop = 0;
  for (const auto& l : linears) {
    Tensor x = ref::generate(1, "x", {n, l.in}, 1.0f), w = ref::generate(1, "w", {l.out, l.in}, 1.0f),
           b = ref::generate(1, "b", {l.out}, 1.0f);
    Tensor y({n, l.out});
    const double flop = 2.0 * n * l.in * l.out;
    double tb = best_seconds([&] { y = ref::linear(x, w, b); }, reps);
    double tp_ = best_seconds([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(l.out), int(l.in), 1.0f, x.ptr(),
                  int(l.in), w.ptr(), int(l.in), 0.0f, y.ptr(), int(l.out));
    }, reps);
    total_block += tb;
    total_plain += tp_;
    total_flop += flop;
    fmt::print("| {} | {} x {} -> {} | {:.1f} | {:.1f} | {:.0f}% |\n", l.name, n, l.in, l.out,
               flop / tb * 1e-9, flop / tp_ * 1e-9, 100 * tp_ / tb);
  }
  fmt::print("| all | | {:.1f} | {:.1f} | {:.0f}% |\n", total_flop / total_block * 1e-9,
             total_flop / total_plain * 1e-9, 100 * total_plain / total_block);
  return 0;
}
