// An exact sum of float64 values: every value is added as an integer multiple
// of the smallest subnormal into 32-bit-wide bins, so adding is associative
// and the result does not depend on the order or on how the values were
// split between threads and processes. Used for the sums of squares behind
// rel L2 and the reference RMS, so that a report is bit-identical whatever
// the chunk size, thread count or process count. Adding costs a few integer
// operations; callers add one partial sum per summation unit, not per element.
#pragma once
#include <array>
#include <cstdint>

namespace dc {

class ExactSum {
 public:
  void add(double x);
  void add(const ExactSum& o);
  // The sum rounded to float64 (a deterministic function of the exact sum);
  // NaN if a NaN was added or +inf and -inf both were, else +-inf if one was.
  double value() const;

 private:
  void normalize();
  // Bin i holds units of 2^(32 i - 1074). 2046 exponent positions plus a
  // 53-bit mantissa need 67 bins; one more takes the carries.
  static constexpr int kBins = 68;
  std::array<std::int64_t, kBins> bins_{};
  std::uint32_t adds_ = 0;  // since the last normalize: bounds the bins' growth
  bool nan_ = false, pos_inf_ = false, neg_inf_ = false;
};

}  // namespace dc
