#include "reference/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "harness/core/error.h"
#include "reference/nn.h"
#include "reference/ops.h"

namespace dc::ref {

template <class T>
BasicTensor<T> flash_attention(const BasicTensor<T>& q, const BasicTensor<T>& k,
                               const BasicTensor<T>& v, std::size_t block_q, std::size_t block_kv) {
  if (q.rank() != 3 || k.rank() != 3 || k.shape != v.shape || q.shape[0] != k.shape[0] ||
      q.shape[2] != k.shape[2])
    fail("flash_attention: q {} k {} v {} are not [heads, N, D]", shape_str(q.shape),
         shape_str(k.shape), shape_str(v.shape));
  if (block_q == 0 || block_kv == 0) fail("flash_attention: block sizes must be positive");
  const std::size_t heads = q.shape[0], nq = q.shape[1], nk = k.shape[1], d = q.shape[2];
  BasicTensor<T> out(q.shape);
  const BasicTensor<T> none;
  for (std::size_t h = 0; h < heads; ++h) {
    auto qh = take_rows(reshape(q, {heads * nq, d}), h * nq, (h + 1) * nq);
    auto kh = take_rows(reshape(k, {heads * nk, d}), h * nk, (h + 1) * nk);
    auto vh = take_rows(reshape(v, {heads * nk, d}), h * nk, (h + 1) * nk);
    for (std::size_t q0 = 0; q0 < nq; q0 += block_q) {
      const std::size_t bq = std::min(block_q, nq - q0);
      auto qb = take_rows(qh, q0, q0 + bq);
      std::vector<T> m(bq, -std::numeric_limits<T>::infinity()), l(bq, T(0));
      BasicTensor<T> o({bq, d}, T(0));
      for (std::size_t k0 = 0; k0 < nk; k0 += block_kv) {
        const std::size_t bk = std::min(block_kv, nk - k0);
        auto s = linear(qb, take_rows(kh, k0, k0 + bk), none);  // [bq, bk]
        auto vb = take_rows(vh, k0, k0 + bk);                   // [bk, d]
        std::vector<T> alpha(bq);
        for (std::size_t i = 0; i < bq; ++i) {
          T* row = s.ptr() + i * bk;
          const T m_new = std::max(m[i], *std::max_element(row, row + bk));
          alpha[i] = std::exp(m[i] - m_new);
          T sum = 0;
          for (std::size_t j = 0; j < bk; ++j) sum += row[j] = std::exp(row[j] - m_new);
          l[i] = alpha[i] * l[i] + sum;
          m[i] = m_new;
        }
        auto pv = matmul_nn(s, vb);  // [bq, d]
        for (std::size_t i = 0; i < bq; ++i)
          for (std::size_t c = 0; c < d; ++c) o.data[i * d + c] = alpha[i] * o.data[i * d + c] + pv.data[i * d + c];
      }
      for (std::size_t i = 0; i < bq; ++i)
        for (std::size_t c = 0; c < d; ++c)
          out.data[(h * nq + q0 + i) * d + c] = o.data[i * d + c] / l[i];
    }
  }
  return out;
}

template BasicTensor<float> flash_attention(const BasicTensor<float>&, const BasicTensor<float>&,
                                            const BasicTensor<float>&, std::size_t, std::size_t);
template BasicTensor<double> flash_attention(const BasicTensor<double>&, const BasicTensor<double>&,
                                             const BasicTensor<double>&, std::size_t, std::size_t);

}  // namespace dc::ref
