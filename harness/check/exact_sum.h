// An exact sum of float64 values: every value is added as an integer multiple
// of the smallest subnormal into 32-bit-wide bins, so adding is associative
// and the result does not depend on the order or on how the values were
// split between threads and processes. Used for the sums of squares behind
// rel L2 and the reference RMS, so that a report is bit-identical whatever
// the chunk size, thread count or process count. Adding costs a few integer
// operations; callers add one partial sum per summation unit, not per element.
#pragma once
#include <array>
#include <cstddef>
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

// A sum of squares that cannot overflow for finite values (an activation
// file may hold values near 1e300, and an RMS of inf would make the derived
// tolerance infinite: every element would pass). Callers add one float64
// partial sum per summation unit, the fast path; a unit whose partial sum is
// not finite is added again value by value: squares of |x| >= 2^500 go,
// scaled by 2^-1200, into a second exact sum. Still exact and associative.
class SquareSum {
 public:
  // Adds a unit's partial sum of squares. False when it is not finite: the
  // caller adds that unit's values with add_value instead.
  bool add_partial(double partial);
  void add_value(double x);
  void add(const SquareSum& o);
  // sqrt(sum / n), the root mean square over n values; 0 for n = 0.
  double rms(std::size_t n) const;
  // sqrt(a / b) (rel L2); sqrt(a) when b is 0. NaN or inf when a value was.
  static double sqrt_ratio(const SquareSum& a, const SquareSum& b);

 private:
  static constexpr int kScaleExp = 1200;  // big_ counts units of 2^1200
  // The sum as m * 2^(kScaleExp * e), e in {0, 1}, m finite unless a
  // non-finite value was added.
  double mantissa(int& e) const;
  ExactSum small_, big_;
};

}  // namespace dc
