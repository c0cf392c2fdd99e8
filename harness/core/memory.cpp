#include "harness/core/memory.h"

#include <malloc.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace dc {
namespace {
// glibc's defaults (mallopt(3)): 65536 mmapped blocks at most, trim above 128 KiB free.
constexpr int kDefaultMmapMax = 65536;
constexpr int kDefaultTrimThreshold = 128 * 1024;
}  // namespace

bool free_pages_reported_to_host(const std::string& balloon_devices) {
  // The virtio spec's VIRTIO_BALLOON_F_REPORTING: feature bit 5. sysfs shows
  // the features the driver negotiated as a string of '0'/'1', bit 0 first.
  constexpr std::size_t kReportingBit = 5;
  std::error_code ec;
  for (const auto& dev : std::filesystem::directory_iterator(balloon_devices, ec)) {
    std::ifstream f(dev.path() / "features");
    std::string bits;
    if (std::getline(f, bits) && bits.size() > kReportingBit && bits[kReportingBit] == '1') return true;
  }
  return false;
}

bool want_huge_pages() {
  const char* asked = std::getenv("DIFFCHECK_HUGEPAGES");
  const std::string a = asked ? asked : "";
  if (a == "0") return false;
  if (a == "1") return true;
  return !free_pages_reported_to_host("/sys/bus/virtio/drivers/virtio_balloon");
}

void exec_with_huge_pages(char** argv) {
  if (!want_huge_pages()) return;
  const char* given = std::getenv("GLIBC_TUNABLES");
  std::string tunables = given ? given : "";
  if (tunables.find("glibc.malloc.hugetlb") != std::string::npos) return;
  std::ifstream mode("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  if (!std::getline(mode, modes) || modes.find("[never]") != std::string::npos) return;
  tunables += std::string(tunables.empty() ? "" : ":") + "glibc.malloc.hugetlb=1";
  if (setenv("GLIBC_TUNABLES", tunables.c_str(), 1) != 0) return;
  // By the program's path, not /proc/self/exe: the process takes its name
  // from the file executed, and `ps`, `top` and `pgrep diffcheck` (the way to
  // find a hung rank) would show every rank as "exe".
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n > 0) {
    path[n] = 0;
    execv(path, argv);  // fails when the file was replaced since (" (deleted)")
  }
  execv("/proc/self/exe", argv);
  // Not re-executed (no /proc?): go on with small pages.
}

RetainFreedMemory::RetainFreedMemory() {
  mallopt(M_MMAP_MAX, 0);                 // every block from the heap ...
  mallopt(M_TRIM_THRESHOLD, -1);  // ... and freed blocks kept there (-1: never trimmed)
}

RetainFreedMemory::~RetainFreedMemory() {
  mallopt(M_MMAP_MAX, kDefaultMmapMax);
  mallopt(M_TRIM_THRESHOLD, kDefaultTrimThreshold);
  malloc_trim(0);
}

}  // namespace dc
