// How a run's big, short-lived tensors get their memory.
//
// glibc serves every allocation above 32 MiB with its own mmap and returns it
// to the kernel on free, so each of a scenario's GB-sized temporaries pays a
// page fault and a page clear per 4 KiB when first touched: at flux1-dev size
// that was a sixth of the run (perf: clear_page and the fault path, 7 M minor
// faults for 4 ranks). Within a RetainFreedMemory scope, big blocks come from
// the heap and freed ones stay there for the next tensor; the scope's end
// restores glibc's defaults (the checker's later reads measure their own
// growth, read_guard.h) and gives back what is free at the top of the heap.
#pragma once

namespace dc {

// Transparent huge pages for malloc's memory: glibc's tunable
// glibc.malloc.hugetlb=1 makes malloc madvise its heap and mappings
// MADV_HUGEPAGE, so a GB-sized tensor costs a fault per 2 MiB instead of per
// 4 KiB. At flux1-dev size (4 ranks, cached references) that took a run from
// 61 s to 32 s: the sharded block 28.8 -> 19.0 s, reading the cached
// references 10.7 -> 1.9 s, the run file's write 15.5 -> 6.2 s. Tunables are
// read when a process starts, so this re-executes the program with the
// tunable added to GLIBC_TUNABLES (same pid, before MPI or any thread
// exists). The caller decides when the tensors are big enough to gain.
// (On a VM that hands freed memory back to its host, new memory costs a host
// fault per page either way: there, cached flux1-dev against its GEMM floor
// was 1.07x with huge pages and 1.05x without, 5 pairs each — no measurable
// difference; docs/usage.md, "Memory".)
// Does nothing when the tunable is already set (by us or the user),
// when the kernel's THP mode is "never", or with DIFFCHECK_HUGEPAGES=0.
// Returns only when it does not re-execute.
void exec_with_huge_pages(char** argv);

class RetainFreedMemory {
 public:
  RetainFreedMemory();
  ~RetainFreedMemory();
  RetainFreedMemory(const RetainFreedMemory&) = delete;
  RetainFreedMemory& operator=(const RetainFreedMemory&) = delete;
};

}  // namespace dc
