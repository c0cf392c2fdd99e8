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

class RetainFreedMemory {
 public:
  RetainFreedMemory();
  ~RetainFreedMemory();
  RetainFreedMemory(const RetainFreedMemory&) = delete;
  RetainFreedMemory& operator=(const RetainFreedMemory&) = delete;
};

}  // namespace dc
