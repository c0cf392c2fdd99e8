// HDF5 1.10 loops forever on some damaged files and crashes on others
// (tests/fuzz found both in its global heap, under string attributes). A
// checker that hangs or dies on a bad file is worse than none, so every step
// of reading a file runs under a ReadGuard:
//   - a step that takes longer than the limit (DIFFCHECK_READ_STALL, 10 s),
//     or during which the process grows by more than DIFFCHECK_READ_MEMORY
//     (MiB, default 512): a monitor thread names the file and the step and
//     ends the process with exit 2 (an input error);
//   - a fatal signal during a step whose instruction is outside diffcheck's
//     own code (in libhdf5, or libc/zlib called by it): the same, exit 2.
// A fault in our own code goes on to the handler that was there before (the
// crash report, a sanitizer), so our own bugs still crash loudly.
// What the guard cannot see: a damaged file that makes HDF5 corrupt memory
// without faulting. Only a separate process would contain that.
// Private to capture, like every other HDF5 matter.
#pragma once
#include <cstddef>
#include <string>

namespace dc::h5 {

class ReadGuard {
 public:
  // `what` names the file and the step: "f.h5: reading the root attributes".
  explicit ReadGuard(std::string what);
  ~ReadGuard();
  ReadGuard(const ReadGuard&) = delete;
  ReadGuard& operator=(const ReadGuard&) = delete;

 private:
  unsigned long long id_;
  std::string what_;
  const char* outer_;  // the enclosing step of this thread, if any
};

// The calling thread's innermost read step, or null outside any.
const char* current_read_step();

// Seconds one step may take: DIFFCHECK_READ_STALL (default 10; 0 = no limit).
double stall_limit_seconds();

// A read-only mapping of a file that the checker reads values from
// (h5_data.cpp's windows). A file cut short after it was mapped makes the
// read of its missing pages fault (SIGBUS); while registered, that ends the
// process with exit 2 naming the file (another program rewriting it, most
// likely), not as a crash of diffcheck.
class GuardedMapping {
 public:
  GuardedMapping(const void* start, std::size_t bytes, std::string file);
  ~GuardedMapping();
  GuardedMapping(const GuardedMapping&) = delete;
  GuardedMapping& operator=(const GuardedMapping&) = delete;

 private:
  int slot_ = -1;  // -1: every slot was taken (the fault stays a crash)
  std::string file_;
};

// Replaces the default action (print one line, _exit(2)); the handler must
// not return and, for a signal, must be async-signal-safe enough for a dying
// process. `seconds` is 0 for a signal. For the fuzzer, which keeps the input.
using ReadFailureHandler = void (*)(const char* what, const char* failure, double seconds);
void set_read_failure_handler(ReadFailureHandler handler);

}  // namespace dc::h5
