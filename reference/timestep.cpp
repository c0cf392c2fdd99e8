#include "reference/timestep.h"

#include <cmath>

namespace dc::ref {

Schedule flow_match_schedule(int n_steps, int image_seq_len) {
  Schedule s;
  const double m = (1.15 - 0.5) / (4096.0 - 256.0);
  const double b = 0.5 - 256.0 * m;
  const double mu = image_seq_len * m + b;
  for (int i = 0; i < n_steps; ++i) {
    double hat = n_steps == 1 ? 1.0 : 1.0 + (1.0 / n_steps - 1.0) * i / (n_steps - 1);
    double sigma = std::exp(mu) / (std::exp(mu) + (1.0 / hat - 1.0));
    s.sigmas.push_back(sigma);
    s.timesteps.push_back(1000.0 * sigma);
  }
  s.sigmas.push_back(0.0);
  return s;
}

template <class T>
BasicTensor<T> timestep_sinusoid(double t, int dim) {
  const int half = dim / 2;
  BasicTensor<T> e({static_cast<std::size_t>(dim)});
  for (int k = 0; k < half; ++k) {
    double f = std::exp(-std::log(10000.0) * k / half);
    e.data[k] = static_cast<T>(std::cos(t * f));
    e.data[half + k] = static_cast<T>(std::sin(t * f));
  }
  return e;
}

template BasicTensor<float> timestep_sinusoid<float>(double, int);
template BasicTensor<double> timestep_sinusoid<double>(double, int);

}  // namespace dc::ref
