#include "harness/core/work_counter.h"

#include <atomic>

namespace dc::work {
namespace {
std::atomic<double> g_flops[2]{0.0, 0.0};
}

void add_gemm_flops(double flops, bool float64) {
  g_flops[float64 ? 1 : 0].fetch_add(flops, std::memory_order_relaxed);
}

double gemm_flops(bool float64) { return g_flops[float64 ? 1 : 0].load(std::memory_order_relaxed); }

}  // namespace dc::work
