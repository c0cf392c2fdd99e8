// Floating-point work done by this process, for the run's profile: the
// reference kernels (reference/nn.cpp: every GEMM of the sharded blocks and
// the references goes through them) add 2·m·n·k per GEMM, per precision.
// Counters are atomic: kernels may run on several threads.
#pragma once

namespace dc::work {

void add_gemm_flops(double flops, bool float64);
double gemm_flops(bool float64);  // since the process started

}  // namespace dc::work
