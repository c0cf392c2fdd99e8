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
