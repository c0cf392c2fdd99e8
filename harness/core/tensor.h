// A dense row-major tensor: a shape and a flat vector. Deliberately tiny so that
// every header can use it; the heavy math (xtensor, BLAS) stays in reference/*.cpp.
#pragma once
#include <cstddef>
#include <numeric>
#include <string>
#include <vector>

namespace dc {

using Shape = std::vector<std::size_t>;

inline std::size_t numel(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), std::size_t{1}, std::multiplies<>());
}

std::string shape_str(const Shape& s);

template <class T>
struct BasicTensor {
  Shape shape;
  std::vector<T> data;

  BasicTensor() = default;
  explicit BasicTensor(Shape s, T fill = T{}) : shape(std::move(s)), data(numel(shape), fill) {}
  BasicTensor(Shape s, std::vector<T> d) : shape(std::move(s)), data(std::move(d)) {}

  std::size_t size() const { return data.size(); }
  std::size_t rank() const { return shape.size(); }
  T* ptr() { return data.data(); }
  const T* ptr() const { return data.data(); }
};

// Sharded runs compute in float (bfloat16 is emulated by rounding float);
// references compute in double.
using Tensor = BasicTensor<float>;
using RefTensor = BasicTensor<double>;

// Row-major strides and index conversion.
std::vector<std::size_t> strides_of(const Shape& s);
std::vector<std::size_t> unravel(std::size_t flat, const Shape& s);
std::string index_str(const std::vector<std::size_t>& idx);

}  // namespace dc
