#include "reference/ops.h"

#include <algorithm>

#include "harness/core/error.h"

namespace dc::ref {

template <class T>
BasicTensor<T> take_last(const BasicTensor<T>& x, const ColumnRanges& ranges) {
  const std::size_t cols = x.shape.back(), rows = x.size() / cols;
  std::size_t width = 0;
  for (auto [a, b] : ranges) {
    if (a > b || b > cols) fail("take_last: columns [{},{}) outside {}", a, b, cols);
    width += b - a;
  }
  Shape s = x.shape;
  s.back() = width;
  BasicTensor<T> y(s);
  for (std::size_t r = 0; r < rows; ++r) {
    T* dst = y.ptr() + r * width;
    for (auto [a, b] : ranges) dst = std::copy(x.ptr() + r * cols + a, x.ptr() + r * cols + b, dst);
  }
  return y;
}

template <class T>
BasicTensor<T> concat_last(const BasicTensor<T>& a, const BasicTensor<T>& b) {
  Shape sa(a.shape.begin(), a.shape.end() - 1), sb(b.shape.begin(), b.shape.end() - 1);
  if (sa != sb) fail("concat_last: {} and {} differ before the last dimension", shape_str(a.shape), shape_str(b.shape));
  const std::size_t ca = a.shape.back(), cb = b.shape.back(), rows = a.size() / ca;
  Shape s = a.shape;
  s.back() = ca + cb;
  BasicTensor<T> y(s);
  for (std::size_t r = 0; r < rows; ++r) {
    std::copy(a.ptr() + r * ca, a.ptr() + (r + 1) * ca, y.ptr() + r * (ca + cb));
    std::copy(b.ptr() + r * cb, b.ptr() + (r + 1) * cb, y.ptr() + r * (ca + cb) + ca);
  }
  return y;
}

template <class T>
BasicTensor<T> take_rows(const BasicTensor<T>& x, std::size_t a, std::size_t b) {
  if (x.rank() == 0 || a > b || b > x.shape[0]) fail("take_rows: [{},{}) outside {}", a, b, shape_str(x.shape));
  const std::size_t inner = x.shape[0] ? x.size() / x.shape[0] : 0;
  Shape s = x.shape;
  s[0] = b - a;
  return BasicTensor<T>(s, std::vector<T>(x.data.begin() + a * inner, x.data.begin() + b * inner));
}

template <class T>
BasicTensor<T> concat_rows(const BasicTensor<T>& a, const BasicTensor<T>& b) {
  if (a.rank() == 0 || b.rank() == 0 || Shape(a.shape.begin() + 1, a.shape.end()) != Shape(b.shape.begin() + 1, b.shape.end()))
    fail("concat_rows: {} and {} differ after the first dimension", shape_str(a.shape), shape_str(b.shape));
  Shape s = a.shape;
  s[0] += b.shape[0];
  BasicTensor<T> y(s);
  std::copy(b.data.begin(), b.data.end(), std::copy(a.data.begin(), a.data.end(), y.data.begin()));
  return y;
}

template <class T>
BasicTensor<T> transpose2(const BasicTensor<T>& x) {
  if (x.rank() != 2) fail("transpose2: {} is not a matrix", shape_str(x.shape));
  const std::size_t r = x.shape[0], c = x.shape[1];
  BasicTensor<T> y({c, r});
  for (std::size_t i = 0; i < r; ++i)
    for (std::size_t j = 0; j < c; ++j) y.data[j * r + i] = x.data[i * c + j];
  return y;
}

template <class T>
BasicTensor<T> heads_major(const BasicTensor<T>& x, std::size_t a, std::size_t b) {
  if (x.rank() != 3 || a > b || b > x.shape[1]) fail("heads_major: heads [{},{}) of {}", a, b, shape_str(x.shape));
  const std::size_t n = x.shape[0], h = x.shape[1], d = x.shape[2];
  BasicTensor<T> y({b - a, n, d});
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = a; j < b; ++j)
      std::copy(x.ptr() + (i * h + j) * d, x.ptr() + (i * h + j + 1) * d, y.ptr() + ((j - a) * n + i) * d);
  return y;
}

template <class T>
BasicTensor<T> token_major(const BasicTensor<T>& x) {
  if (x.rank() != 3) fail("token_major: {} is not [heads, tokens, D]", shape_str(x.shape));
  const std::size_t h = x.shape[0], n = x.shape[1], d = x.shape[2];
  BasicTensor<T> y({n, h, d});
  for (std::size_t j = 0; j < h; ++j)
    for (std::size_t i = 0; i < n; ++i)
      std::copy(x.ptr() + (j * n + i) * d, x.ptr() + (j * n + i + 1) * d, y.ptr() + (i * h + j) * d);
  return y;
}

template <class T>
BasicTensor<T> token_rows(const BasicTensor<T>& x, std::size_t a, std::size_t b) {
  if (x.rank() < 2 || a > b || b > x.shape[1]) fail("token_rows: rows [{},{}) of {}", a, b, shape_str(x.shape));
  const std::size_t h = x.shape[0], n = x.shape[1], per = x.size() / (h * n);
  Shape s = x.shape;
  s[1] = b - a;
  BasicTensor<T> y(s);
  for (std::size_t i = 0; i < h; ++i)
    std::copy(x.ptr() + (i * n + a) * per, x.ptr() + (i * n + b) * per, y.ptr() + i * (b - a) * per);
  return y;
}

template <class T>
BasicTensor<T> batch_item(const BasicTensor<T>& x, std::size_t i) {
  return take_rows(x, i, i + 1);
}

template <class T>
BasicTensor<T> stack(const std::vector<BasicTensor<T>>& xs) {
  if (xs.empty()) fail("stack: nothing to stack");
  Shape s{xs.size()};
  s.insert(s.end(), xs[0].shape.begin(), xs[0].shape.end());
  BasicTensor<T> y(s);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (xs[i].shape != xs[0].shape) fail("stack: shapes {} and {} differ", shape_str(xs[i].shape), shape_str(xs[0].shape));
    std::copy(xs[i].data.begin(), xs[i].data.end(), y.data.begin() + i * xs[0].size());
  }
  return y;
}

template <class T>
BasicTensor<T> reshape(BasicTensor<T> x, Shape s) {
  if (numel(s) != x.size()) fail("reshape: {} to {}", shape_str(x.shape), shape_str(s));
  x.shape = std::move(s);
  return x;
}

#define DC_INSTANTIATE(T)                                                              \
  template BasicTensor<T> take_last(const BasicTensor<T>&, const ColumnRanges&);       \
  template BasicTensor<T> concat_last(const BasicTensor<T>&, const BasicTensor<T>&);   \
  template BasicTensor<T> batch_item(const BasicTensor<T>&, std::size_t);              \
  template BasicTensor<T> concat_rows(const BasicTensor<T>&, const BasicTensor<T>&);   \
  template BasicTensor<T> transpose2(const BasicTensor<T>&);                           \
  template BasicTensor<T> heads_major(const BasicTensor<T>&, std::size_t, std::size_t); \
  template BasicTensor<T> token_major(const BasicTensor<T>&);                          \
  template BasicTensor<T> token_rows(const BasicTensor<T>&, std::size_t, std::size_t);  \
  template BasicTensor<T> stack(const std::vector<BasicTensor<T>>&);                   \
  template BasicTensor<T> take_rows(const BasicTensor<T>&, std::size_t, std::size_t);  \
  template BasicTensor<T> reshape(BasicTensor<T>, Shape);
DC_INSTANTIATE(float)
DC_INSTANTIATE(double)
#undef DC_INSTANTIATE

}  // namespace dc::ref
