// What the CPU can run: the vectorised kernels (AVX2+FMA builds, through
// SLEEF) are called only where it has both. Private to reference/.
#pragma once

namespace dc::ref {

inline bool avx2_fma_available() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
#else
  return false;
#endif
}

}  // namespace dc::ref
