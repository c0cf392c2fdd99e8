// The flow-matching denoise schedule of FLUX (diffusers' FlowMatchEulerDiscrete
// with dynamic shifting) and the sinusoidal timestep embedding.
#pragma once
#include <vector>

#include "harness/core/tensor.h"

namespace dc::ref {

struct Schedule {
  std::vector<double> timesteps;  // n values, 1000 * sigma_i
  std::vector<double> sigmas;     // n + 1 values, the last is 0
};

// sigma_hat_i = linspace(1, 1/n, n); mu = seq*m + b with m = (1.15-0.5)/(4096-256),
// b = 0.5 - 256 m; sigma_i = e^mu / (e^mu + (1/sigma_hat_i - 1)).
Schedule flow_match_schedule(int n_steps, int image_seq_len);

// [cos(t f_k) | sin(t f_k)], f_k = exp(-ln(10000) k / (dim/2)), k < dim/2
// (flip_sin_to_cos=True, downscale_freq_shift=0). The argument t*f_k is formed
// in float64 whatever T is: at t=1000 float32 would put a phase error of
// ~1000 ulp into every value, which is not what this harness tests.
template <class T>
BasicTensor<T> timestep_sinusoid(double t, int dim);

}  // namespace dc::ref
