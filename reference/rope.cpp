#include "reference/rope.h"

#include <cmath>
#include <numeric>

#include "harness/core/error.h"

namespace dc::ref {

RopeTable rope_table(const std::vector<std::vector<double>>& positions,
                     const std::vector<int>& axes_dim, double base) {
  const std::size_t n = positions.size();
  const std::size_t d = static_cast<std::size_t>(std::accumulate(axes_dim.begin(), axes_dim.end(), 0));
  RopeTable t{RefTensor({n, d}), RefTensor({n, d})};
  for (std::size_t i = 0; i < n; ++i) {
    if (positions[i].size() != axes_dim.size()) fail("rope_table: {} positions for {} axes", positions[i].size(), axes_dim.size());
    std::size_t col = 0;
    for (std::size_t a = 0; a < axes_dim.size(); ++a) {
      const int dim = axes_dim[a];
      for (int k = 0; k < dim / 2; ++k) {
        double angle = positions[i][a] * std::pow(base, -2.0 * k / dim);
        for (int rep = 0; rep < 2; ++rep) {
          t.cos.data[i * d + col] = std::cos(angle);
          t.sin.data[i * d + col] = std::sin(angle);
          ++col;
        }
      }
    }
  }
  return t;
}

template <class T>
BasicTensor<T> apply_rope(const BasicTensor<T>& x, const RopeTable& t) {
  const std::size_t n = t.cos.shape[0], d = t.cos.shape[1];
  if (x.rank() < 3 || x.shape.back() != d || x.shape[x.rank() - 3] != n)
    fail("apply_rope: {} does not match a table of {} positions x {}", shape_str(x.shape), n, d);
  const std::size_t heads = x.shape[x.rank() - 2], per_item = n * heads * d;
  BasicTensor<T> y(x.shape);
  for (std::size_t base = 0; base < x.size(); base += per_item)
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t h = 0; h < heads; ++h) {
        const T* p = x.ptr() + base + (i * heads + h) * d;
        T* q = y.ptr() + base + (i * heads + h) * d;
        for (std::size_t j = 0; j < d; j += 2) {
          const double c0 = t.cos.data[i * d + j], s0 = t.sin.data[i * d + j];
          const double c1 = t.cos.data[i * d + j + 1], s1 = t.sin.data[i * d + j + 1];
          q[j] = static_cast<T>(p[j] * c0 - p[j + 1] * s0);
          q[j + 1] = static_cast<T>(p[j + 1] * c1 + p[j] * s1);
        }
      }
  return y;
}

template BasicTensor<float> apply_rope(const BasicTensor<float>&, const RopeTable&);
template BasicTensor<double> apply_rope(const BasicTensor<double>&, const RopeTable&);

}  // namespace dc::ref
