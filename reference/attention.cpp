#include "reference/attention.h"

#include <algorithm>
#include <cmath>

#include "harness/core/error.h"
#include "reference/nn.h"
#include "reference/ops.h"

namespace dc::ref {
namespace {

// Head h of x [N, heads, D] as a contiguous [N, D] matrix.
template <class T>
BasicTensor<T> head(const BasicTensor<T>& x, std::size_t h) {
  const std::size_t n = x.shape[0], heads = x.shape[1], d = x.shape[2];
  BasicTensor<T> y({n, d});
  for (std::size_t i = 0; i < n; ++i)
    std::copy(x.ptr() + (i * heads + h) * d, x.ptr() + (i * heads + h + 1) * d, y.ptr() + i * d);
  return y;
}

}  // namespace

template <class T>
BasicTensor<T> attention(const BasicTensor<T>& q, const BasicTensor<T>& k, const BasicTensor<T>& v,
                         double scale) {
  if (q.rank() != 3 || k.shape != v.shape || k.rank() != 3 || q.shape[1] != k.shape[1] ||
      q.shape[2] != k.shape[2])
    fail("attention: q {} k {} v {} are not [N, heads, D]", shape_str(q.shape), shape_str(k.shape),
         shape_str(v.shape));
  const std::size_t nq = q.shape[0], nk = k.shape[0], heads = q.shape[1], d = q.shape[2];
  BasicTensor<T> out(q.shape);
  const BasicTensor<T> none;
  for (std::size_t h = 0; h < heads; ++h) {
    auto qh = head(q, h), kh = head(k, h), vt = transpose2(head(v, h));
    auto s = linear(qh, kh, none);  // [nq, nk] = q k^T
    for (std::size_t i = 0; i < nq; ++i) {
      T* row = s.ptr() + i * nk;
      double m = -INFINITY;
      for (std::size_t j = 0; j < nk; ++j) m = std::max(m, scale * row[j]);
      double sum = 0;
      for (std::size_t j = 0; j < nk; ++j) {
        double p = std::exp(scale * row[j] - m);
        row[j] = static_cast<T>(p);
        sum += p;
      }
      for (std::size_t j = 0; j < nk; ++j) row[j] = static_cast<T>(row[j] / sum);
    }
    auto oh = linear(s, vt, none);  // [nq, D] = P v
    for (std::size_t i = 0; i < nq; ++i)
      std::copy(oh.ptr() + i * d, oh.ptr() + (i + 1) * d, out.ptr() + (i * heads + h) * d);
  }
  return out;
}

template BasicTensor<float> attention(const BasicTensor<float>&, const BasicTensor<float>&,
                                      const BasicTensor<float>&, double);
template BasicTensor<double> attention(const BasicTensor<double>&, const BasicTensor<double>&,
                                       const BasicTensor<double>&, double);

}  // namespace dc::ref
