#include "harness/core/memory.h"

#include <malloc.h>

namespace dc {
namespace {
// glibc's defaults (mallopt(3)): 65536 mmapped blocks at most, trim above 128 KiB free.
constexpr int kDefaultMmapMax = 65536;
constexpr int kDefaultTrimThreshold = 128 * 1024;
}  // namespace

RetainFreedMemory::RetainFreedMemory() {
  mallopt(M_MMAP_MAX, 0);                 // every block from the heap ...
  mallopt(M_TRIM_THRESHOLD, 0x7fffffff);  // ... and freed blocks kept there
}

RetainFreedMemory::~RetainFreedMemory() {
  mallopt(M_MMAP_MAX, kDefaultMmapMax);
  mallopt(M_TRIM_THRESHOLD, kDefaultTrimThreshold);
  malloc_trim(0);
}

}  // namespace dc
