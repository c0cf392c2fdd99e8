#include "reference/attention.h"

#include <algorithm>
#include <vector>

#include "harness/core/error.h"
#include "reference/nn.h"
#include "reference/softmax.h"

namespace dc::ref {
namespace {

// Query rows per block. BLAS packs all of k_h for the first GEMM and all of
// v_h for the second again for every block, at memory speed, against
// 2 x rows flops per packed value: at 64 rows that packing was 3% of a
// flux1-dev first run's samples, and 256 rows made its references 6% faster
// (3 pairs). The block's scores (256 x 4608 float64, 9.4 MB) then come from
// L3 or memory for the exp pass and the second GEMM, which costs less.
constexpr std::size_t kRowBlock = 256;

}  // namespace

template <class T>
BasicTensor<T> attention(const BasicTensor<T>& q, const BasicTensor<T>& k, const BasicTensor<T>& v,
                         double scale) {
  if (q.rank() != 3 || k.shape != v.shape || k.rank() != 3 || q.shape[1] != k.shape[1] ||
      q.shape[2] != k.shape[2])
    fail("attention: q {} k {} v {} are not [N, heads, D]", shape_str(q.shape), shape_str(k.shape),
         shape_str(v.shape));
  const std::size_t nq = q.shape[0], nk = k.shape[0], heads = q.shape[1], d = q.shape[2];
  const std::size_t ld = heads * d;  // a head is every ld-th row segment of d values
  BasicTensor<T> out(q.shape);
  std::vector<T> s(std::min(nq, kRowBlock) * nk);
  std::vector<double> sums(kRowBlock);
  for (std::size_t h = 0; h < heads; ++h) {
    for (std::size_t q0 = 0; q0 < nq; q0 += kRowBlock) {
      const std::size_t rows = std::min(kRowBlock, nq - q0);
      T* o = out.ptr() + q0 * ld + h * d;
      // s = q_h k_hᵀ, then exp(scale s - max) in place, then o = s v_h / sum:
      // the normalisation on the D outputs of a row, not on its Nk weights.
      gemm_strided<T>(true, rows, nk, d, q.ptr() + q0 * ld + h * d, ld, k.ptr() + h * d, ld, s.data(), nk);
      exp_rows(s.data(), rows, nk, scale, sums.data());
      gemm_strided<T>(false, rows, d, nk, s.data(), nk, v.ptr() + h * d, ld, o, ld);
      for (std::size_t i = 0; i < rows; ++i) {
        const T sum = static_cast<T>(sums[i]);
        for (std::size_t c = 0; c < d; ++c) o[i * ld + c] /= sum;
      }
    }
  }
  return out;
}

template BasicTensor<float> attention(const BasicTensor<float>&, const BasicTensor<float>&,
                                      const BasicTensor<float>&, double);
template BasicTensor<double> attention(const BasicTensor<double>&, const BasicTensor<double>&,
                                       const BasicTensor<double>&, double);

}  // namespace dc::ref
