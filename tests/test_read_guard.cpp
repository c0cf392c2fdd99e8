// The read guard turns a fault inside a library (HDF5, or libc called by it)
// during a read step into an input error, exit 2, naming the file and step.
// The hostile-file fixtures reach it only through HDF5's own out-of-bounds
// reads, whose faulting depends on the memory layout of the process (CI saw
// one of them read mapped memory instead), so the guard is proven here with a
// fault that always happens: libc's strlen on an unmapped address.
#include <gtest/gtest.h>

#include <cstring>

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

}  // namespace
