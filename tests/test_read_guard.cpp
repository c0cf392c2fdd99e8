// The read guard turns a fault inside a library (HDF5, or libc called by it)
// during a read step into an input error, exit 2, naming the file and step.
// The hostile-file fixtures reach it only through HDF5's own out-of-bounds
// reads, whose faulting depends on the memory layout of the process (CI saw
// one of them read mapped memory instead), so the guard is proven here with a
// fault that always happens: libc's strlen on an unmapped address.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "harness/capture/read_guard.h"

namespace {

// Through a volatile pointer so the compiler cannot see (and fold) the call.
std::size_t (*volatile libc_strlen)(const char*) = std::strlen;
const char* volatile unmapped = reinterpret_cast<const char*>(16);

void fault_in_libc_during(const char* step) {
  dc::h5::ReadGuard guard(step);
  (void)libc_strlen(unmapped);
}

void fault_in_own_code_during(const char* step) {
  dc::h5::ReadGuard guard(step);
  (void)*static_cast<const volatile char*>(unmapped);
}

TEST(ReadGuardDeathTest, FaultInsideALibraryIsAnInputErrorNamingTheStep) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(fault_in_libc_during("f.h5: reading the root attributes"), testing::ExitedWithCode(2),
              "diffcheck error: f\\.h5: reading the root attributes: crashed \\(SIGSEGV\\) inside HDF5");
}

TEST(ReadGuardDeathTest, FaultInOurOwnCodeStillCrashes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // A bug of ours is not the file's doing: no exit 2, whatever handled the
  // signal before (the default action here, a sanitizer in build-sanitize).
  EXPECT_EXIT(fault_in_own_code_during("f.h5: reading the root attributes"),
              [](int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 2); }, "");
}

TEST(ReadGuardDeathTest, FaultOutsideAnyStepIsNotAnInputError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        { dc::h5::ReadGuard guard("f.h5: a step that ended"); }
        (void)libc_strlen(unmapped);
      },
      [](int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 2); }, "");
}

// A mapped file that another program cuts short: the read of a page it lost
// faults (SIGBUS). While the mapping is guarded, that is an input error
// naming the file; the same read of an unguarded mapping stays a crash.
void read_a_mapping_of_a_file_cut_short(bool guarded) {
  char path[] = "/tmp/diffcheck-read-guard-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::size_t bytes = 1 << 20;
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::unique_ptr<dc::h5::GuardedMapping> guard;
  if (guarded) guard = std::make_unique<dc::h5::GuardedMapping>(p, bytes, "cut.h5");
  ASSERT_EQ(ftruncate(fd, 0), 0);
  unlink(path);
  (void)static_cast<const volatile char*>(p)[bytes / 2];
}

TEST(ReadGuardDeathTest, AMappedFileCutShortIsAnInputErrorNamingTheFile) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(read_a_mapping_of_a_file_cut_short(true), testing::ExitedWithCode(2),
              "diffcheck error: cut\\.h5: the file is shorter than when it was opened");
  EXPECT_EXIT(read_a_mapping_of_a_file_cut_short(false),
              [](int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 2); }, "");
}

}  // namespace
