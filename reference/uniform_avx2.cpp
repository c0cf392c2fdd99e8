// Compiled with -mavx2 -ffp-contract=off (reference/CMakeLists.txt) and called
// only when the CPU has AVX2 (generate.cpp checks at run time).
//
// Eight Philox4x32-10 streams at once, one per 32-bit lane: the counters of
// eight consecutive indices, the same key. Each lane does exactly what
// Random123's scalar philox4x32 does (32x32 -> 64-bit products split into
// high and low words, xors, the Weyl key bumps), and the float conversion is
// uniform_at's, operation by operation; so the values are uniform_at's, bit
// for bit (tests/test_reference.cpp holds them to it).
#include <immintrin.h>

#include <cstdint>

#include "reference/generate.h"

namespace dc::ref {
namespace {

// lo = low words of a * m, lane by lane; hi = the high words.
inline __m256i mul_hi_lo(__m256i a, __m256i m, __m256i& hi) {
  const __m256i even = _mm256_mul_epu32(a, m);                         // lanes 0, 2, 4, 6: 64-bit products
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);   // lanes 1, 3, 5, 7
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  return _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

}  // namespace

void uniform_run_avx2(std::uint64_t seed, std::uint32_t id, std::uint64_t first, std::size_t n, float scale,
                      float* out) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u)), m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  const __m256 unit = _mm256_set1_ps(1.0f / 16777216.0f), two = _mm256_set1_ps(2.0f), one = _mm256_set1_ps(1.0f),
               scale8 = _mm256_set1_ps(scale);
  const std::uint32_t key0_start = static_cast<std::uint32_t>(seed ^ (seed >> 32));
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    alignas(32) std::uint32_t lo[8], hi[8];
    for (int l = 0; l < 8; ++l) {
      const std::uint64_t index = first + i + static_cast<std::uint64_t>(l);
      lo[l] = static_cast<std::uint32_t>(index);
      hi[l] = static_cast<std::uint32_t>(index >> 32);
    }
    __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo));
    __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi));
    __m256i c2 = _mm256_set1_epi32(0x64636b21), c3 = _mm256_setzero_si256();
    std::uint32_t k0 = key0_start, k1 = id;
    for (int round = 0; round < 10; ++round) {
      if (round > 0) {
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
      }
      __m256i hi0, hi1;
      const __m256i lo0 = mul_hi_lo(c0, m0, hi0), lo1 = mul_hi_lo(c2, m1, hi1);
      const __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
      const __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
      c0 = n0;
      c1 = lo1;
      c2 = n2;
      c3 = lo0;
    }
    // 24 random bits -> [0, 1), then to [-scale, scale): uniform_at's steps.
    const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c0, 8)), unit);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_sub_ps(_mm256_mul_ps(two, u), one), scale8));
  }
  for (; i < n; ++i) out[i] = uniform_at(seed, id, first + i, scale);
}

}  // namespace dc::ref
