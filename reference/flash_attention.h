// Online-softmax ("flash", as in splash attention) attention: for each block of
// bq queries, walk the keys in blocks of bkv keeping a running max m, sum l and
// output o:  s = q kᵀ;  m' = max(m, rowmax s);  p = exp(s - m');  a = exp(m - m');
// l = a l + rowsum p;  o = a o + p v;  finally o / l.
// No scaling inside (callers pre-scale k, as the Ulysses kernel registry does).
#pragma once
#include "harness/core/tensor.h"

namespace dc::ref {

// q: [heads, Nq, D], k and v: [heads, Nk, D] (head-major, as after the Ulysses
// all-to-all) -> [heads, Nq, D]. Block sizes need not divide the lengths.
template <class T>
BasicTensor<T> flash_attention(const BasicTensor<T>& q, const BasicTensor<T>& k,
                               const BasicTensor<T>& v, std::size_t block_q, std::size_t block_kv);

}  // namespace dc::ref
