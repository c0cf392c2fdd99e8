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

#include <string>

namespace dc {

// Transparent huge pages for malloc's memory: glibc's tunable
// glibc.malloc.hugetlb=1 makes malloc madvise its heap and mappings
// MADV_HUGEPAGE, so a GB-sized tensor costs a fault per 2 MiB instead of per
// 4 KiB. At flux1-dev size (4 ranks, cached references) that took a run from
// 61 s to 32 s when first measured (81a9ba9). Tunables are read when a process starts, so this
// re-executes the program with the tunable added to GLIBC_TUNABLES (same pid,
// before MPI or any thread exists). The caller decides when the tensors are
// big enough to gain.
//
// Not where the kernel hands free memory back to its host (virtio-balloon
// free page reporting). It reports free blocks of 2 MiB and more
// (page_reporting_order 9), exactly the blocks a huge page is cut from, so
// every huge page lands on memory the host has taken back and costs a host
// fault per 4 KiB, while small pages are mostly served from the smaller free
// fragments the guest still has backed. On the 2-core VM this was measured on,
// after a day's uptime: a fresh 2 GiB memset ran at 0.5 GB/s with huge pages
// and 2.8 GB/s without; flux1-dev tp=4 took 10-12% longer with them (first
// runs, 3 pairs) and 10-25% longer cached (docs/usage.md, "Memory").
//
// DIFFCHECK_HUGEPAGES=1 asks for them regardless, =0 never; unset, they are
// asked for unless free pages are reported. Does nothing when the tunable is
// already set (by us or the user) or when the kernel's THP mode is "never".
// Returns only when it does not re-execute.
void exec_with_huge_pages(char** argv);

// Whether a virtio balloon device under `balloon_devices` (its driver's sysfs
// directory) negotiated free page reporting.
bool free_pages_reported_to_host(const std::string& balloon_devices);

// DIFFCHECK_HUGEPAGES, else whether this kernel keeps its free memory.
bool want_huge_pages();

class RetainFreedMemory {
 public:
  RetainFreedMemory();
  ~RetainFreedMemory();
  RetainFreedMemory(const RetainFreedMemory&) = delete;
  RetainFreedMemory& operator=(const RetainFreedMemory&) = delete;
};

}  // namespace dc
