#include "harness/check/exact_sum.h"

#include <bit>
#include <cmath>
#include <limits>

namespace dc {

void ExactSum::add(double x) {
  if (x == 0) return;
  if (!std::isfinite(x)) {
    if (std::isnan(x))
      nan_ = true;
    else
      (x > 0 ? pos_inf_ : neg_inf_) = true;
    return;
  }
  const std::uint64_t bits = std::bit_cast<std::uint64_t>(x);
  const int biased = static_cast<int>((bits >> 52) & 0x7ff);
  std::uint64_t mantissa = bits & ((std::uint64_t{1} << 52) - 1);
  if (biased != 0) mantissa |= std::uint64_t{1} << 52;
  // x = mantissa * 2^(position - 1074), position in [0, 2045]
  const int position = biased == 0 ? 0 : biased - 1;
  const int bin = position / 32, shift = position % 32;
  // mantissa << shift spans bits 0..84: three 32-bit pieces.
  const std::uint64_t low64 = mantissa << shift;  // bits 0..63 (higher bits dropped)
  const auto lo = static_cast<std::int64_t>(low64 & 0xffffffffu);
  const auto mid = static_cast<std::int64_t>(low64 >> 32);
  const auto hi = static_cast<std::int64_t>(shift == 0 ? 0 : mantissa >> (64 - shift));
  const std::int64_t sign = x < 0 ? -1 : 1;
  bins_[bin] += sign * lo;
  bins_[bin + 1] += sign * mid;
  bins_[bin + 2] += sign * hi;
  // Each add moves a bin by less than 2^32; normalizing every 2^30 adds keeps
  // every bin far from overflow.
  if (++adds_ == (1u << 30)) normalize();
}

void ExactSum::add(const ExactSum& o) {
  for (int i = 0; i < kBins; ++i) bins_[i] += o.bins_[i];
  nan_ = nan_ || o.nan_;
  pos_inf_ = pos_inf_ || o.pos_inf_;
  neg_inf_ = neg_inf_ || o.neg_inf_;
  adds_ = 0;
  normalize();
}

// Carries so that every bin but the last lies in [0, 2^32); the sign of the
// whole sum is then the sign of the last bin.
void ExactSum::normalize() {
  for (int i = 0; i + 1 < kBins; ++i) {
    const std::int64_t carry = bins_[i] >> 32;  // arithmetic shift: floor division
    bins_[i] -= carry * (std::int64_t{1} << 32);
    bins_[i + 1] += carry;
  }
  adds_ = 0;
}

double ExactSum::value() const {
  if (nan_ || (pos_inf_ && neg_inf_)) return std::numeric_limits<double>::quiet_NaN();
  if (pos_inf_) return std::numeric_limits<double>::infinity();
  if (neg_inf_) return -std::numeric_limits<double>::infinity();
  ExactSum n = *this;
  n.normalize();
  double sign = 1;
  if (n.bins_[kBins - 1] < 0) {  // a negative sum: take the magnitude
    for (auto& b : n.bins_) b = -b;
    n.normalize();
    sign = -1;
  }
  // Highest bins first: the first three carry at least 64 significant bits,
  // more than a double keeps; the result depends only on the exact sum.
  double r = 0;
  int top = kBins - 1;
  while (top > 0 && n.bins_[top] == 0) --top;
  for (int i = top; i >= 0 && i >= top - 3; --i)
    r += std::ldexp(static_cast<double>(n.bins_[i]), 32 * i - 1074);
  return sign * r;
}

bool SquareSum::add_partial(double partial) {
  if (!std::isfinite(partial)) return false;
  small_.add(partial);
  return true;
}

void SquareSum::add_value(double x) {
  if (std::abs(x) >= 0x1p500) {
    const double y = std::ldexp(x, -kScaleExp / 2);
    big_.add(y * y);
  } else {
    small_.add(x * x);  // NaN lands here and makes the sum NaN
  }
}

void SquareSum::add(const SquareSum& o) {
  small_.add(o.small_);
  big_.add(o.big_);
}

double SquareSum::mantissa(int& e) const {
  const double big = big_.value(), small = small_.value();
  if (std::isnan(big) || std::isnan(small)) {
    e = 0;
    return std::numeric_limits<double>::quiet_NaN();
  }
  if (big == 0) {
    e = 0;
    return small;
  }
  e = 1;
  return big + std::ldexp(small, -kScaleExp);
}

double SquareSum::rms(std::size_t n) const {
  if (n == 0) return 0;
  int e = 0;
  const double m = mantissa(e);
  return std::ldexp(std::sqrt(m / static_cast<double>(n)), e * kScaleExp / 2);
}

double SquareSum::sqrt_ratio(const SquareSum& a, const SquareSum& b) {
  int ea = 0, eb = 0;
  const double ma = a.mantissa(ea), mb = b.mantissa(eb);
  if (mb == 0) return std::ldexp(std::sqrt(ma), ea * kScaleExp / 2);
  // sqrt(ma 2^(1200 ea) / (mb 2^(1200 eb))): the scales apply after the
  // root, so a ratio near 1e250 stays finite.
  return std::ldexp(std::sqrt(ma / mb), (ea - eb) * kScaleExp / 2);
}

}  // namespace dc
