#include "harness/core/files.h"

#include <fmt/format.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "harness/core/error.h"
#include "harness/core/interrupt.h"

namespace dc {

void write_whole_file(const std::string& path, const std::string& text, const std::string& what) {
  const std::string tmp = path + ".tmp";
  const interrupt::Removal if_stopped(tmp);
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) fail("cannot write {} '{}'", what, tmp);
    out << text;
    if (!out.flush()) fail("cannot write {} '{}'", what, tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    fail("cannot write {} '{}': {}", what, path, ec.message());
  }
}

bool directory_shared(const Comm& world, const std::string& dir) {
  if (world.size() == 1) return true;
  std::string token, path;
  if (world.rank() == 0) {
    std::random_device rd;
    token = fmt::format("{}-{}-{:x}{:x}", ::getpid(),
                        std::chrono::steady_clock::now().time_since_epoch().count(), rd(), rd());
    path = (std::filesystem::path(dir.empty() ? "." : dir) / (".diffcheck-probe-" + token)).string();
  }
  const interrupt::Removal if_stopped(path);
  if (world.rank() == 0) std::ofstream(path) << token;
  token = world.broadcast_string(token, 0);
  path = (std::filesystem::path(dir.empty() ? "." : dir) / (".diffcheck-probe-" + token)).string();
  std::string seen;
  if (std::ifstream in(path); in) std::getline(in, seen);
  const bool shared = world.max_int(seen == token ? 0 : 1) == 0;
  world.barrier();  // every rank has looked before the probe goes
  if (world.rank() == 0) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
  return shared;
}

std::string read_text_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) input_error("cannot read the {} '{}': {}", what, path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::optional<std::uint64_t> available_bytes(const std::string& dir) {
  struct statvfs st {};
  if (statvfs(dir.c_str(), &st) != 0) return std::nullopt;
  return static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
}

}  // namespace dc
