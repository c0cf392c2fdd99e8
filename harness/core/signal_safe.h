// Output from signal handlers: write(2) only, no allocation, no locks.
#pragma once
#include <unistd.h>

#include <cstring>
#include <string>

namespace dc::signal_safe {

inline void put(const char* s) {
  ssize_t ignored = write(2, s, std::strlen(s));
  (void)ignored;
}

inline void put_number(long long v) {
  char buf[24];
  int i = 23;
  buf[i] = '\0';
  const bool neg = v < 0;
  unsigned long long u = neg ? 0ull - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
  do {
    buf[--i] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u && i > 1);
  if (neg) buf[--i] = '-';
  put(buf + i);
}

// Copies s into a fixed buffer, cut to fit.
inline void copy(char* dst, std::size_t cap, const char* s, std::size_t n) {
  if (n > cap - 1) n = cap - 1;
  std::memcpy(dst, s, n);
  dst[n] = '\0';
}
// Filled outside the handler, from a string (which may allocate: not in one).
inline void copy(char* dst, std::size_t cap, const std::string& s) { copy(dst, cap, s.data(), s.size()); }

}  // namespace dc::signal_safe
