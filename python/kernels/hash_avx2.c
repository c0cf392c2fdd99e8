/* XXH3 compiled for AVX2 (this file alone is built with -mavx2; CMake adds it
 * on x86-64). sketch_cpu.c calls these only where the CPU has AVX2
 * (__builtin_cpu_supports), else its own portable (SSE2) copy. XXH3 gives
 * the same hash whichever vector code computed it, and both copies share
 * one state layout, so a streaming state may pass between them.
 *
 * Why: the portable copy hashed at ~17 GB/s here, half the speed of reading
 * memory, and the hashes are the bulk of a dct.watch check (every parameter
 * and gradient read) and of a sketch capture's replicas; AVX2 doubles it. */
#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t diffcheck_xxh3_avx2(const void *x, size_t bytes) { return XXH3_64bits(x, bytes); }

void diffcheck_xxh3_update_avx2(XXH3_state_t *state, const void *x, size_t bytes) {
  XXH3_64bits_update(state, x, bytes);
}
