// Four doubles at a time for the comparator's scans (check/scans.cpp and
// check/reference_scan.h): GCC's vector extension, with the one branch of the
// hot loops (any/all lanes of a mask) written for baseline x86-64 and for
// AVX2. Included only by scans.cpp, whose functions inline these into both
// of their builds.
#pragma once
#include <cstring>
#include <limits>

#include <immintrin.h>

namespace dc::simd {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Four doubles, as GCC's vector extension (no intrinsics): two SSE2 registers
// on baseline x86-64, one AVX2 register in the clone compiled for it (below).
// A pair of them holds the eight summation lanes of the reference scan.
// Comparisons give per-lane masks (all ones where true). Lane k of an add is the same IEEE operation as the scalar one (no
// FMA is enabled, so nothing is contracted), so sums keep their bits on
// either path.
// (Only inlined helpers take and return them: -Wpsabi's note on how 32-byte
// vectors are passed between functions does not apply.)
#pragma GCC diagnostic ignored "-Wpsabi"
using Quad = double __attribute__((vector_size(32)));
using Mask = long long __attribute__((vector_size(32)));

[[gnu::always_inline]] inline Quad load4(const double* p) {
  Quad v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// Four floats widened (exactly): cvtps2pd on baseline x86-64, one vcvtps2pd
// to a ymm register in the AVX2 build.
[[gnu::always_inline]] inline Quad load4(const float* p) { return Quad{p[0], p[1], p[2], p[3]}; }
// Eight floats as they are, for tests that need no widening.
using Oct = float __attribute__((vector_size(32)));
[[gnu::always_inline]] inline Oct load8(const float* p) {
  Oct v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline Quad splat(double v) { return Quad{v, v, v, v}; }
[[gnu::always_inline]] inline Quad abs4(const Quad& v) { return (Quad)((Mask)v & ~(Mask)splat(-0.0)); }

// The sum of eight lanes held as lanes 0-3 and 4-7, in one fixed order:
// ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)).
[[gnu::always_inline]] inline double lane_sum(const Quad& lo, const Quad& hi) {
  const Quad t = lo + hi;
  return (t[0] + t[1]) + (t[2] + t[3]);
}

// Whether any (all) lanes of a mask are set: the hot loops' one branch.
// Baseline x86-64 folds the halves first; AVX2 asks in one instruction
// (vptest, vmovmskpd), where moving each lane out to an integer register took
// a fifth of the scan.
struct PortableSimd {
  [[gnu::always_inline]] static inline bool any(const Mask& m) {
    const Mask t = m | __builtin_shufflevector(m, m, 2, 3, 0, 1);
    return (t[0] | t[1]) != 0;
  }
  [[gnu::always_inline]] static inline bool all(const Mask& m) {
    const Mask t = m & __builtin_shufflevector(m, m, 2, 3, 0, 1);
    return (t[0] & t[1]) == -1;
  }
  // Lane k set: bit k.
  [[gnu::always_inline]] static inline unsigned bits(const Mask& m) {
    return static_cast<unsigned>((m[0] & 1) | (m[1] & 2) | (m[2] & 4) | (m[3] & 8));
  }
};
struct Avx2Simd {
  // Not always_inline: the scan's body is inlined into its AVX2 build first.
  [[gnu::target("avx2")]] static inline bool any(const Mask& m) { return !_mm256_testz_si256(m, m); }
  [[gnu::target("avx2")]] static inline bool all(const Mask& m) { return bits(m) == 0xF; }
  [[gnu::target("avx2")]] static inline unsigned bits(const Mask& m) {
    return static_cast<unsigned>(_mm256_movemask_pd(reinterpret_cast<__m256d>(m)));
  }
};

}  // namespace dc::simd
