#include "harness/core/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace dc {

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ",")); }

std::vector<std::size_t> strides_of(const Shape& s) {
  std::vector<std::size_t> st(s.size(), 1);
  for (std::size_t i = s.size(); i-- > 1;) st[i - 1] = st[i] * s[i];
  return st;
}

std::vector<std::size_t> unravel(std::size_t flat, const Shape& s) {
  std::vector<std::size_t> idx(s.size(), 0);
  for (std::size_t i = s.size(); i-- > 0;) {
    idx[i] = flat % s[i];
    flat /= s[i];
  }
  return idx;
}

std::string index_str(const std::vector<std::size_t>& idx) {
  return fmt::format("[{}]", fmt::join(idx, ","));
}

}  // namespace dc
