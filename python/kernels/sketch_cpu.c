/* The CPU sketch of a float32, float64, bfloat16 or float16 tap in one pass, summed in float64
 * (diffcheck/sketch.py, docs/FORMAT.md "Sketch taps"): the fused twin of the
 * torch-ops path and of diffcheck.jax's XLA sketch, loaded by diffcheck/kernels/library.py through ctypes.
 *
 * Why not a matrix product: with k = 8 sign rows the torch path widens each
 * float32 tap to float64 (a float32 sketch's own rounding swamps a float32
 * run's error of 1e-7) and then multiplies a 9-row matrix, three passes over
 * the tap. Here the rows are taken four at a time: a token's four signs are a
 * 4-bit pattern, and the token's row is added (in float64) into one of 16
 * buckets per group of four rows. Each sketch row is then the buckets summed
 * with the signs their pattern gives that row, and the column sums (row k)
 * are all the buckets of a group summed. Per element: one conversion and
 * ceil(k/4) additions, in one read of the tap.
 *
 * Columns go a tile at a time, so that a tile's buckets stay in the
 * second-level cache (137 KiB for k = 8; the tile's width mattered little
 * between 256 and 4096 columns when measured); bucket rows are padded off
 * 4 KiB strides, where loads and stores of the same low address bits stall
 * each other.
 *
 * Within a tile, tokens go BLOCK_ROWS at a time and each block a strip of
 * STRIP columns at a time: a strip's buckets (16 KiB for k = 8) stay in the
 * first-level cache while the block's rows go through them. Added token by
 * token into the tile's whole width, every row's two bucket rows came from
 * the second-level cache and went back, and that traffic kept the tap's own
 * read from overlapping with the additions: out of cache a [1024, 512]
 * float32 piece took 285-320 us, 125 us in cache; by strips 155 us (and a
 * [1024, 4096] one 2000 against 2860 us; in cache a narrow piece pays for
 * the strips' bookkeeping, [1024, 512] 141-195 against 121 us). The strips read each row in
 * pieces, which the hardware's prefetcher does not follow, so each strip
 * of a row asks for the same strip BLOCK_ROWS tokens on (without it, 400 us).
 * Every bucket still adds its tokens in token order: the sums are the
 * same bits as token by token. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GROUP_ROWS 4
#define PATTERNS (1 << GROUP_ROWS)
#define TILE 512                 /* columns whose buckets are summed at a time */
#define BUCKET_STRIDE (TILE + 24) /* doubles from one bucket row to the next */
#define STRIP 64                 /* columns whose buckets a block of tokens goes through at a time */
#define BLOCK_ROWS 32            /* tokens at a time; also how far ahead a strip is fetched */
#define PREFETCH(p) __builtin_prefetch((p), 0, 2) /* to the second-level cache */

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* The element kinds a piece may hold (diffcheck/kernels/library.py KINDS). */
enum { KIND_F32 = 0, KIND_F64 = 1, KIND_BF16 = 2, KIND_F16 = 3 };

static inline double load_plain_f32(float v) { return (double)v; }
static inline double load_plain_f64(double v) { return v; }

/* bfloat16 is float32's upper half. */
static inline double load_bf16(uint16_t b) {
  union { uint32_t u; float f; } v = {(uint32_t)b << 16};
  return (double)v.f;
}

/* IEEE half to float without a half type: the exponent and mantissa moved
 * up to float32's places and scaled by 2^112 (exact for normals and
 * subnormals), Inf and NaN set apart, the sign put back. */
static inline double load_f16(uint16_t h) {
  uint32_t magnitude = h & 0x7FFFu;
  union { uint32_t u; float f; } v = {magnitude << 13};
  v.f *= 0x1p112f;
  if (magnitude >= 0x7C00u) v.u = 0x7F800000u | ((magnitude & 0x3FFu) << 13);
  v.u |= (uint32_t)(h & 0x8000u) << 16;
  return (double)v.f;
}

/* The strip of the token BLOCK_ROWS on, asked for while this token's is added (spread out: asked
 * for all at once before a block, they came no sooner than without). */
#define FETCH_AHEAD(T)                                                                                  \
  if (t + BLOCK_ROWS < tokens)                                                                          \
    for (int64_t j = 0; j < m; j += 64 / (int64_t)sizeof(T)) PREFETCH(row + BLOCK_ROWS * token_stride + j)

/* The buckets of one strip (columns 0..m-1 of x) for tokens r0..r1-1 of a
 * piece whose token t starts at x + t * token_stride; patterns[g * tokens + t]
 * is token t's pattern in group g. Groups go two at a time: one read of the
 * row feeds both. LOAD widens an element to double. */
#define STRIP_KERNEL(NAME, T, LOAD)                                                                     \
  static inline void NAME##_strip(const T *x, int64_t r0, int64_t r1, int64_t tokens,                  \
                                  int64_t token_stride, int64_t m, const uint8_t *patterns,             \
                                  int32_t groups, double *buckets) {                                    \
    int32_t g = 0;                                                                                      \
    for (; g + 1 < groups; g += 2)                                                                      \
      for (int64_t t = r0; t < r1; ++t) {                                                               \
        const T *row = x + t * token_stride;                                                            \
        if (g == 0) FETCH_AHEAD(T);                                                                     \
        double *restrict b0 =                                                                           \
            buckets + ((size_t)g * PATTERNS + patterns[(size_t)g * tokens + t]) * BUCKET_STRIDE;        \
        double *restrict b1 =                                                                           \
            buckets + ((size_t)(g + 1) * PATTERNS + patterns[(size_t)(g + 1) * tokens + t]) * BUCKET_STRIDE; \
        for (int64_t j = 0; j < m; ++j) {                                                               \
          double v = LOAD(row[j]);                                                                      \
          b0[j] += v;                                                                                   \
          b1[j] += v;                                                                                   \
        }                                                                                               \
      }                                                                                                 \
    for (; g < groups; ++g)                                                                             \
      for (int64_t t = r0; t < r1; ++t) {                                                               \
        const T *row = x + t * token_stride;                                                            \
        if (g == 0) FETCH_AHEAD(T);                                                                     \
        double *restrict b =                                                                            \
            buckets + ((size_t)g * PATTERNS + patterns[(size_t)g * tokens + t]) * BUCKET_STRIDE;        \
        for (int64_t j = 0; j < m; ++j) b[j] += LOAD(row[j]);                                           \
      }                                                                                                 \
  }                                                                                                     \
  /* The buckets of a tile (columns 0..n-1): tokens a block at a time, each block a strip at a time. */ \
  VECTOR_CLONES static void NAME(const T *x, int64_t tokens, int64_t token_stride, int64_t n,          \
                                 const uint8_t *patterns, int32_t groups, double *buckets) {            \
    memset(buckets, 0, sizeof(double) * (size_t)groups * PATTERNS * BUCKET_STRIDE);                     \
    for (int64_t r0 = 0; r0 < tokens; r0 += BLOCK_ROWS) {                                               \
      int64_t r1 = tokens - r0 < BLOCK_ROWS ? tokens : r0 + BLOCK_ROWS;                                 \
      int64_t s0 = 0;                                                                                   \
      for (; s0 + STRIP <= n; s0 += STRIP) /* a whole strip: its loop unrolled, no remainder */         \
        NAME##_strip(x + s0, r0, r1, tokens, token_stride, STRIP, patterns, groups, buckets + s0);     \
      if (s0 < n)                                                                                       \
        NAME##_strip(x + s0, r0, r1, tokens, token_stride, n - s0, patterns, groups, buckets + s0);    \
    }                                                                                                   \
  }

STRIP_KERNEL(buckets_f32, float, load_plain_f32)
STRIP_KERNEL(buckets_f64, double, load_plain_f64)
STRIP_KERNEL(buckets_bf16, uint16_t, load_bf16)
STRIP_KERNEL(buckets_f16, uint16_t, load_f16)

/* Rows 0..k of the sketch for columns 0..n-1, into out (row stride width):
 * row i < k is group i/4's buckets with sign -1 where the pattern has bit
 * i%4 set; row k, every bucket of group 0. */
static void combine(const double *buckets, int32_t k, int64_t n, double *out, int64_t width) {
  for (int32_t i = 0; i <= k; ++i) {
    double *restrict o = out + (size_t)i * width;
    const double *group = buckets + (size_t)(i == k ? 0 : i / GROUP_ROWS) * PATTERNS * BUCKET_STRIDE;
    for (int64_t j = 0; j < n; ++j) o[j] = 0;
    for (int p = 0; p < PATTERNS; ++p) {
      const double *b = group + (size_t)p * BUCKET_STRIDE;
      if (i == k || !((p >> (i % GROUP_ROWS)) & 1))
        for (int64_t j = 0; j < n; ++j) o[j] += b[j];
      else
        for (int64_t j = 0; j < n; ++j) o[j] -= b[j];
    }
  }
}

/* The sketch [lead][k + 1][width] (float64, contiguous) of a piece of `lead`
 * matrices [tokens][width] at x, strides in elements (the width's is 1).
 * kind: float32 (0), float64 (1), bfloat16 (2) or float16 (3); 16-bit
 * pieces are summed in float64 too (diffcheck.jax's host sketches). patterns: [ceil(k/4)][tokens], token t's bits
 * in group g (bit b set: row 4g + b has sign -1). Returns 0, or -1 if the
 * buckets could not be allocated (the caller then takes the torch path). */
int diffcheck_sketch_cpu(const void *x, int32_t kind, int64_t lead, int64_t lead_stride, int64_t tokens,
                         int64_t token_stride, int64_t width, const uint8_t *patterns, int32_t k, double *out) {
  int32_t groups = (k + GROUP_ROWS - 1) / GROUP_ROWS;
  double *buckets = malloc(sizeof(double) * (size_t)groups * PATTERNS * BUCKET_STRIDE);
  if (buckets == NULL) return -1;
  for (int64_t l = 0; l < lead; ++l)
    for (int64_t j0 = 0; j0 < width; j0 += TILE) {
      int64_t n = width - j0 < TILE ? width - j0 : TILE;
      int64_t at = l * lead_stride + j0;
      switch (kind) {
        case KIND_F64: buckets_f64((const double *)x + at, tokens, token_stride, n, patterns, groups, buckets); break;
        case KIND_BF16: buckets_bf16((const uint16_t *)x + at, tokens, token_stride, n, patterns, groups, buckets); break;
        case KIND_F16: buckets_f16((const uint16_t *)x + at, tokens, token_stride, n, patterns, groups, buckets); break;
        default: buckets_f32((const float *)x + at, tokens, token_stride, n, patterns, groups, buckets);
      }
      combine(buckets, k, n, out + (size_t)l * (k + 1) * width + j0, width);
    }
  free(buckets);
  return 0;
}

static uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  return h ^ (h >> 16);
}

/* What a replicated piece also needs, in the same single read: the bits hash
 * of diffcheck/sketch.py's bits_hash (each row's bytes as 64-bit words summed
 * with wrapping, row r's sum weighted by the odd number
 * (fmix32(r * 0x9E3779B1) >> 1) | 1, the products summed with wrapping) and
 * the exact NaN and Inf counts, of a contiguous float32 (element_size 4) or
 * float64 (8) piece of `rows` rows of `width` elements, width * element_size
 * a multiple of 8. */
VECTOR_CLONES void diffcheck_piece_bits(const void *x, int32_t element_size, int64_t rows, int64_t width, uint64_t *hash,
                          int64_t *nan, int64_t *inf) {
  const uint64_t *words = x;
  int64_t row_words = width * element_size / 8;
  uint64_t total = 0;
  int64_t nans = 0, infs = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t *row = words + r * row_words;
    uint64_t sum = 0;
    uint64_t special = 0; /* some element of the row has its exponent all ones */
    if (element_size == 4) {
      for (int64_t j = 0; j < row_words; ++j) {
        uint64_t w = row[j];
        sum += w;
        special |= ((w & 0x7F800000ull) == 0x7F800000ull) | (((w >> 32) & 0x7F800000ull) == 0x7F800000ull);
      }
    } else {
      for (int64_t j = 0; j < row_words; ++j) {
        uint64_t w = row[j];
        sum += w;
        special |= (w & 0x7FF0000000000000ull) == 0x7FF0000000000000ull;
      }
    }
    if (special) { /* rare: count this row's NaN and Inf one by one */
      if (element_size == 4) {
        const uint32_t *e = (const uint32_t *)row;
        for (int64_t j = 0; j < width; ++j)
          if ((e[j] & 0x7F800000u) == 0x7F800000u) (e[j] & 0x007FFFFFu) ? ++nans : ++infs;
      } else {
        for (int64_t j = 0; j < row_words; ++j)
          if ((row[j] & 0x7FF0000000000000ull) == 0x7FF0000000000000ull)
            (row[j] & 0x000FFFFFFFFFFFFFull) ? ++nans : ++infs;
      }
    }
    total += sum * (uint64_t)((fmix32((uint32_t)((uint64_t)r * 0x9E3779B1u)) >> 1) | 1u);
  }
  *hash = total;
  *nan = nans;
  *inf = infs;
}

/* dct.watch's hash of a CPU tensor's bytes (diffcheck/watch.py): XXH3's
 * 64-bit hash, a strong hash at memory speed (about 3x zlib's CRC-32 here:
 * the watch's check reads every parameter and gradient, so its speed is the
 * check's cost). Inlined from libxxhash-dev's header, so the module needs no
 * shared library at run time. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#ifdef DIFFCHECK_XXH3_AVX2 /* kernels/hash_avx2.c: the same hash, twice as fast where the CPU has AVX2 */
uint64_t diffcheck_xxh3_avx2(const void *x, size_t bytes);
void diffcheck_xxh3_update_avx2(XXH3_state_t *state, const void *x, size_t bytes);
static int has_avx2(void) {
  static volatile int known = -1; /* a race between threads writes the same answer */
  if (known < 0) known = __builtin_cpu_supports("avx2") ? 1 : 0;
  return known;
}
#endif

static uint64_t xxh3(const void *x, size_t bytes) {
#ifdef DIFFCHECK_XXH3_AVX2
  if (has_avx2()) return diffcheck_xxh3_avx2(x, bytes);
#endif
  return XXH3_64bits(x, bytes);
}

static void xxh3_update(XXH3_state_t *state, const void *x, size_t bytes) {
#ifdef DIFFCHECK_XXH3_AVX2
  if (has_avx2()) {
    diffcheck_xxh3_update_avx2(state, x, bytes);
    return;
  }
#endif
  XXH3_64bits_update(state, x, bytes);
}

uint64_t diffcheck_bytes_hash(const void *x, int64_t bytes) { return xxh3(x, (size_t)bytes); }

/* The portable copy alone, whatever the CPU: the suite checks both copies agree. */
uint64_t diffcheck_bytes_hash_portable(const void *x, int64_t bytes) { return XXH3_64bits(x, (size_t)bytes); }

/* 1 where diffcheck_bytes_hash runs the AVX2 copy. */
int32_t diffcheck_bytes_hash_wide(void) {
#ifdef DIFFCHECK_XXH3_AVX2
  return has_avx2();
#else
  return 0;
#endif
}

/* One dct.watch check's rows in one call (python/diffcheck/watch/hashing.py):
 * for each of the n buffers (ptrs[i], bytes[i] bytes, elements[i] elements)
 * the row [XXH3's hash, elements, 2 (XXH3), 1]; an empty buffer's hash is 0
 * (its pointer may be null), and elements[i] < 0 (no tensor: a parameter with
 * no gradient) gives [0, 0, 0, 0]. One call instead of one per tensor: at every=1 a small
 * model's check was mostly the per-tensor calls. */
void diffcheck_watch_rows(const void *const *ptrs, const int64_t *bytes, const int64_t *elements, int64_t n,
                          int64_t *rows) {
  for (int64_t i = 0; i < n; ++i) {
    int64_t *row = rows + 4 * i;
    if (elements[i] < 0) {
      row[0] = row[1] = row[2] = row[3] = 0;
      continue;
    }
    row[0] = bytes[i] ? (int64_t)xxh3(ptrs[i], (size_t)bytes[i]) : 0;
    row[1] = elements[i];
    row[2] = 2;
    row[3] = 1;
  }
}

/* Exact NaN and Inf counts of n elements whose magnitude bits (the sign
 * masked off) are compared with the all-ones exponent `inf_bits`: above it
 * NaN, equal Inf. The largest magnitude first, one vectorized max in the
 * element's own width: a finite piece (nearly all of them) is known
 * finite there, and only a piece with a NaN or an Inf is counted. (Counting
 * every piece into int64 sums ran at 20 GB/s in cache, slower than the hash
 * beside it.) The maxima are kept in SPECIAL_LANES lanes, several vectors
 * apart, so that they do not wait on one another: 67 -> 97 GB/s in cache. */
#define SPECIAL_LANES 32 /* elements a step: 2 (16-bit) to 8 (64-bit) AVX2 vectors of maxima kept apart */
#define SPECIAL_COUNT(NAME, T, MAGNITUDE)                                               \
  VECTOR_CLONES static void NAME(const T *x, int64_t n, T inf_bits, int64_t *nan, int64_t *inf) { \
    T lanes[SPECIAL_LANES] = {0};                                                       \
    int64_t i = 0;                                                                      \
    for (; i + SPECIAL_LANES <= n; i += SPECIAL_LANES)                                  \
      for (int j = 0; j < SPECIAL_LANES; ++j) {                                         \
        T m = x[i + j] & (T)(MAGNITUDE);                                                \
        lanes[j] = m > lanes[j] ? m : lanes[j];                                         \
      }                                                                                 \
    T largest = 0;                                                                      \
    for (; i < n; ++i) {                                                                \
      T m = x[i] & (T)(MAGNITUDE);                                                      \
      largest = m > largest ? m : largest;                                              \
    }                                                                                   \
    for (int j = 0; j < SPECIAL_LANES; ++j) largest = lanes[j] > largest ? lanes[j] : largest; \
    int64_t nans = 0, infs = 0;                                                         \
    if (largest >= inf_bits) {                                                          \
      for (int64_t i = 0; i < n; ++i) {                                                 \
        T m = x[i] & (T)(MAGNITUDE);                                                    \
        nans += m > inf_bits;                                                           \
        infs += m == inf_bits;                                                          \
      }                                                                                 \
    }                                                                                   \
    *nan = nans;                                                                        \
    *inf = infs;                                                                        \
  }

SPECIAL_COUNT(special_u16, uint16_t, 0x7FFFu)
SPECIAL_COUNT(special_u32, uint32_t, 0x7FFFFFFFu)
SPECIAL_COUNT(special_u64, uint64_t, 0x7FFFFFFFFFFFFFFFull)

/* What diffcheck.jax's host sketch needs of a contiguous piece of n
 * elements of `kind` besides its sketch: XXH3's 64-bit hash of its bytes
 * (replicas of one run compare it; FORMAT.md lets bits_hash be any function
 * of the bytes) and its exact NaN and Inf counts, in one read: the piece
 * goes a chunk at a time through XXH3's streaming state (the same hash as
 * one call over all of it) and, while the chunk is in the second-level
 * cache, through the counts. A chunk of 256 KiB, not 16 KiB as before: the
 * hash's reads of memory then come in long runs the prefetcher follows (a
 * 32 MiB piece out of cache 20 -> 32 GB/s, a 4 MiB one 30 -> 44 GB/s here;
 * XXH3 alone 42 and 60). */
#define CHECK_CHUNK 262144 /* bytes: a multiple of every element size */

void diffcheck_piece_check(const void *x, int32_t kind, int64_t n, int32_t hash_it, uint64_t *hash, int64_t *nan,
                           int64_t *inf) {
  size_t size = kind == KIND_F64 ? 8 : kind == KIND_F32 ? 4 : 2;
  size_t total = (size_t)n * size;
  const char *bytes = x;
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  int64_t nans = 0, infs = 0;
  for (size_t at = 0; at < total; at += CHECK_CHUNK) {
    size_t len = total - at < CHECK_CHUNK ? total - at : CHECK_CHUNK;
    int64_t chunk_nan, chunk_inf;
    if (hash_it) xxh3_update(&state, bytes + at, len);
    switch (kind) {
      case KIND_F64: special_u64((const uint64_t *)(bytes + at), (int64_t)(len / 8), 0x7FF0000000000000ull,
                                 &chunk_nan, &chunk_inf); break;
      case KIND_F32: special_u32((const uint32_t *)(bytes + at), (int64_t)(len / 4), 0x7F800000u,
                                 &chunk_nan, &chunk_inf); break;
      case KIND_BF16: special_u16((const uint16_t *)(bytes + at), (int64_t)(len / 2), 0x7F80u,
                                  &chunk_nan, &chunk_inf); break;
      default: special_u16((const uint16_t *)(bytes + at), (int64_t)(len / 2), 0x7C00u, &chunk_nan, &chunk_inf);
    }
    nans += chunk_nan;
    infs += chunk_inf;
  }
  *hash = hash_it ? XXH3_64bits_digest(&state) : 0;
  *nan = nans;
  *inf = infs;
}
