// Errors that end a run with exit status 2. Every message names what failed
// (rank, operation, file, tap or attribute) so the user never has to guess.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace dc {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Input that does not follow the file format or the command line: a user error.
class InputError : public Error {
 public:
  using Error::Error;
};

// An error every process of the job raised alike (core/agree.h, over the
// world communicator): the job ends cleanly, rank 0 reporting it and every
// rank finalizing, where an error of one rank must abort the job (and the
// launcher then tells of ranks it stopped).
class AgreedError : public Error {
 public:
  using Error::Error;
};

// A fault of the code under test found while it ran (a crash, a desynced
// collective): exit status 1, like a wrong answer. `everywhere`: every rank
// raised it alike (rank 0 alone reports it).
class Finding : public Error {
 public:
  Finding(const std::string& what, bool everywhere) : Error(what), everywhere_(everywhere) {}
  bool everywhere() const { return everywhere_; }

 private:
  bool everywhere_;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

template <class... Args>
[[noreturn]] void input_error(fmt::format_string<Args...> f, Args&&... args) {
  throw InputError(fmt::format(f, std::forward<Args>(args)...));
}

// Exit statuses shared by every command.
inline constexpr int kExitPass = 0;
inline constexpr int kExitMismatch = 1;
inline constexpr int kExitError = 2;

}  // namespace dc
