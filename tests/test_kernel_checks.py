"""The kernel library's whole-piece checks (python/kernels/sketch_cpu.c):
the XXH3 hash, in its AVX2 copy where the CPU has one, equals the portable
copy at every length and alignment; a piece's NaN and Inf counts are exact
for every element kind, wherever the specials sit. numpy only."""
import ctypes
import os
import unittest

import numpy as np

from diffcheck.kernels import library

CHUNK = 16384  # the check's chunk in bytes (CHECK_CHUNK): specials either side of its edges


def _piece_check(piece, kind, hashed=True):
    h, nan, inf = ctypes.c_uint64(), ctypes.c_int64(), ctypes.c_int64()
    library.get("diffcheck_piece_check")(piece.ctypes.data, library.KINDS[kind], piece.size, int(hashed),
                                         ctypes.byref(h), ctypes.byref(nan), ctypes.byref(inf))
    return h.value, nan.value, inf.value


class KernelChecks(unittest.TestCase):
    def setUp(self):
        if library.get("diffcheck_piece_check") is None:
            if os.environ.get(library.ENV):
                self.fail(f"{library.ENV}={os.environ[library.ENV]} did not load")
            self.skipTest("the kernel library is not built")

    def test_wide_and_portable_hashes_agree(self):
        wide, portable = library.get("diffcheck_bytes_hash"), library.get("diffcheck_bytes_hash_portable")
        data = np.random.default_rng(3).integers(0, 256, 70000, dtype=np.uint8)
        seen = set()
        for length in (0, 1, 3, 16, 17, 128, 129, 240, 241, 1023, 1024, 1025, 4095, CHUNK, CHUNK + 1, 65536):
            for offset in (0, 1, 7, 64):
                at = data.ctypes.data + offset
                self.assertEqual(wide(at, length), portable(at, length), (length, offset))
                seen.add(wide(at, length))
        self.assertGreater(len(seen), 50)  # a hash of the bytes, not a constant
        print(f"AVX2 copy in use: {bool(library.get('diffcheck_bytes_hash_wide')())}")

    def test_the_chunked_hash_is_the_whole_hash(self):
        """The check's hash goes through XXH3's streaming state a chunk at a time: the same as one call."""
        piece = np.random.default_rng(4).standard_normal(3 * CHUNK // 4 + 5).astype(np.float32)
        self.assertEqual(_piece_check(piece, "float32")[0],
                         library.get("diffcheck_bytes_hash")(piece.ctypes.data, piece.nbytes))

    def test_nan_and_inf_counts_are_exact_in_every_kind(self):
        import ml_dtypes  # jax's dependency; numpy has no bfloat16
        rng = np.random.default_rng(5)
        for kind, dtype in (("float32", np.float32), ("float64", np.float64), ("float16", np.float16),
                            ("bfloat16", ml_dtypes.bfloat16)):
            n = 3 * CHUNK // np.dtype(dtype).itemsize + 7
            clean = rng.standard_normal(n).astype(dtype)
            clean[::97] = -(ml_dtypes.finfo(dtype).max)  # the largest finite magnitude is not special
            self.assertEqual(_piece_check(clean, kind, hashed=False)[1:], (0, 0), kind)
            edge = CHUNK // np.dtype(dtype).itemsize
            for nan_at, inf_at in (([0], [n - 1]), ([edge - 1, edge], [edge + 1, 2 * edge, 5]), ([], [3]), ([7], [])):
                piece = clean.copy()
                piece[nan_at] = np.nan
                piece[[i for i in inf_at[::2]]] = np.inf
                piece[[i for i in inf_at[1::2]]] = -np.inf
                want = (int(np.isnan(piece.astype(np.float64)).sum()), int(np.isinf(piece.astype(np.float64)).sum()))
                self.assertEqual(_piece_check(piece, kind)[1:], want, (kind, nan_at, inf_at))


if __name__ == "__main__":
    unittest.main()
