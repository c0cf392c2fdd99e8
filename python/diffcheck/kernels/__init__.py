"""The C kernels (python/kernels/sketch_cpu.c, built by CMake as
libdiffcheck_sketch_cpu.so), loaded through ctypes with no framework:
diffcheck.sketch wraps them for torch tensors, diffcheck.jax for the shards
of JAX arrays on CPU devices."""
