// libFuzzer target for the activation-file reader: each input is an HDF5 file
// image, written to a private directory in /dev/shm and read exactly as
// `diffcheck compare FILE` reads it — the metadata (read_activations) and then
// every value (the streaming comparator, which also takes the direct pread
// path for contiguous datasets; an in-memory HDF5 driver would skip that path,
// hence a real file). The name `f.rank0.h5` lets an image be either form: a
// run file (no `rank` attribute) or a one-rank set of rank files.
//
// A malformed file must end in dc::Error (exit 2 in the tool). Anything else
// that escapes — std::bad_alloc, std::out_of_range, a signal, undefined
// behaviour, a step over libFuzzer's -timeout — is a defect, and libFuzzer
// keeps the input. HDF5 1.10 itself loops forever or crashes on some damaged
// files; the reader's guard (capture/read_guard.h) ends those with an input
// error (exit 2 in the tool). Here the guard keeps the input as
// hdf5-guarded-<hash> and exits 3, and scripts/fuzz.sh counts it and fuzzes
// on: a guarded HDF5 failure is the tool working, not a defect. Only a fault
// whose instruction is inside libhdf5 is guarded; ours still crash.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "harness/capture/read_guard.h"
#include "harness/capture/store.h"
#include "harness/check/compare.h"
#include "harness/core/error.h"
#include "harness/core/log.h"

namespace {

// The input's file lives in DIFFCHECK_FUZZ_SCRATCH (scripts/fuzz.sh makes
// one per run and removes it, also after a session that ended in _exit), else
// in a directory of this process under /dev/shm, removed at a normal exit.
std::string scratch_file() {
  namespace fs = std::filesystem;
  static const std::string dir = [] {
    if (const char* d = std::getenv("DIFFCHECK_FUZZ_SCRATCH"); d && *d) return std::string(d);
    std::string d = fmt::format("/dev/shm/diffcheck-fuzz-{}", getpid());
    fs::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(fmt::format("/dev/shm/diffcheck-fuzz-{}", getpid()), ec);
    });
    return d;
  }();
  return dir + "/f.rank0.h5";
}

const std::uint8_t* g_input = nullptr;
std::size_t g_size = 0;

// The reader's guard caught HDF5 looping or crashing (possibly in a signal
// handler: only write(2) and friends here).
[[noreturn]] void keep_input(const char* what, const char* failure, double) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a of the input names the file
  for (std::size_t i = 0; i < g_size; ++i) h = (h ^ g_input[i]) * 1099511628211ull;
  char name[64];
  std::snprintf(name, sizeof name, "hdf5-guarded-%016llx", static_cast<unsigned long long>(h));
  int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    if (write(fd, g_input, g_size) < 0) {
    }
    close(fd);
  }
  char line[512];
  int n = std::snprintf(line, sizeof line, "fuzz_reader: HDF5 %s, guarded (%s); input kept as %s\n",
                        failure, what, name);
  if (n > 0 &&
      write(2, line, std::min<std::size_t>(static_cast<std::size_t>(n), sizeof line - 1)) < 0) {
  }
  _exit(3);
}

}  // namespace

// HDF5 keeps caches and free lists that outlive a file (and, on some error
// paths of damaged files, allocations it never frees); those are HDF5's, not
// the reader's. The reader holds every HDF5 object in an RAII handle.
extern "C" const char* __lsan_default_suppressions() { return "leak:libhdf5\n"; }
extern "C" const char* __lsan_default_options() { return "print_suppressions=0"; }
// A damaged file can make HDF5 ask for terabytes; like glibc's malloc (what
// users run), the allocator says no and HDF5 reports an error.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }

// AddressSanitizer reports memory errors inside HDF5 (e.g. its global heap
// reader overruns a buffer on a damaged heap) that the tool's users would
// see as a fault, or not at all. Those that happen during a guarded read step
// and whose innermost frame of either HDF5 or ours is HDF5's are kept and
// counted like a guarded fault; every other report is a defect of ours.
// The frames above it belong to neither: the sanitizer's runtime (HDF5 frees
// a pointer a damaged file gave it, and the fault is in ASan's free, linked
// into this binary), libc, zlib, libstdc++. Ours are the frames with a source
// line under this tree (the targets are built with -g): " /src/x.cpp:41:19",
// where a frame without one names its module, "(/src/build-fuzz/fuzz_reader+0x..)".
extern "C" void __asan_set_error_report_callback(void (*)(const char*));

enum class FrameOwner { hdf5, ours, neither };

FrameOwner owner_of(const std::string& frame) {
  if (frame.find("libhdf5") != std::string::npos) return FrameOwner::hdf5;
  if (frame.find(" " DIFFCHECK_SOURCE_DIR "/") != std::string::npos) return FrameOwner::ours;
  return FrameOwner::neither;
}

// The report's first stack (the access or the fault), innermost first.
FrameOwner innermost_owner(const std::string& report) {
  for (int i = 0; i < 64; ++i) {
    const std::string tag = fmt::format("    #{} ", i);
    const auto at = report.find(tag);
    if (at == std::string::npos) break;
    const auto end = report.find('\n', at);
    const FrameOwner o = owner_of(report.substr(at, end == std::string::npos ? end : end - at));
    if (o != FrameOwner::neither) return o;
  }
  return FrameOwner::neither;
}

void on_asan_report(const char* report) {
  const char* step = dc::h5::current_read_step();
  if (step && innermost_owner(report) == FrameOwner::hdf5)
    keep_input(step, "memory error (AddressSanitizer)", 0);
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  __asan_set_error_report_callback(on_asan_report);
  setenv("DIFFCHECK_LOG", "error", 0);
  setenv("DIFFCHECK_READ_STALL", "3", 0);  // below libFuzzer's -timeout of 10 s
  dc::setup_logging(-1);
  dc::h5::set_read_failure_handler(keep_input);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  g_input = data;
  g_size = size;
  const std::string path = scratch_file();
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) __builtin_trap();
    if (size && std::fwrite(data, 1, size, f) != size) __builtin_trap();
    std::fclose(f);
  }
  try {
    dc::ActivationSet set = dc::read_activations(path);
    dc::CompareOptions opts;
    opts.threads = 1;
    opts.memory_budget = std::size_t{64} << 20;
    (void)dc::compare(set, opts);
  } catch (const dc::Error&) {
    // A refused file: what the tool reports as an input error.
  }
  return 0;
}
