// Shape plumbing for scenarios: slices and concatenations along the last
// dimension, batch items, head views. No arithmetic beyond copying.
#pragma once
#include <utility>
#include <vector>

#include "harness/core/tensor.h"

namespace dc::ref {

using ColumnRanges = std::vector<std::pair<std::size_t, std::size_t>>;

// The columns [a,b) of each range, in order, along the last dimension.
template <class T>
BasicTensor<T> take_last(const BasicTensor<T>& x, const ColumnRanges& ranges);
// [a | b] along the last dimension; leading dimensions must match.
template <class T>
BasicTensor<T> concat_last(const BasicTensor<T>& a, const BasicTensor<T>& b);
// Item i of the first dimension, keeping the dimension (size 1).
template <class T>
BasicTensor<T> batch_item(const BasicTensor<T>& x, std::size_t i);
// Stack equally shaped tensors along a new first dimension.
template <class T>
BasicTensor<T> stack(const std::vector<BasicTensor<T>>& xs);
// [a ; b] along the first dimension; trailing dimensions must match.
template <class T>
BasicTensor<T> concat_rows(const BasicTensor<T>& a, const BasicTensor<T>& b);
// [r, c] -> [c, r].
template <class T>
BasicTensor<T> transpose2(const BasicTensor<T>& x);
// Head layouts of attention: token-major [n, h, D] <-> head-major [h, n, D].
// heads_major keeps heads [a, b) only.
template <class T>
BasicTensor<T> heads_major(const BasicTensor<T>& x, std::size_t a, std::size_t b);
template <class T>
BasicTensor<T> token_major(const BasicTensor<T>& x);
// Rows [a, b) of dimension 1 of a head-major [h, n, ...] tensor.
template <class T>
BasicTensor<T> token_rows(const BasicTensor<T>& x, std::size_t a, std::size_t b);
// Rows [a,b) of the first dimension.
template <class T>
BasicTensor<T> take_rows(const BasicTensor<T>& x, std::size_t a, std::size_t b);
// Same data with a leading dimension of size 1 (a one-sample batch).
template <class T>
BasicTensor<T> with_batch_dim(BasicTensor<T> x) {
  x.shape.insert(x.shape.begin(), 1);
  return x;
}
// Same data, new shape (element count must match).
template <class T>
BasicTensor<T> reshape(BasicTensor<T> x, Shape s);

}  // namespace dc::ref
