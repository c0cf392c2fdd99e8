#include "harness/core/files.h"

#include <filesystem>
#include <fstream>

#include "harness/core/error.h"

namespace dc {

void write_whole_file(const std::string& path, const std::string& text, const std::string& what) {
  const std::string tmp = path + ".tmp";
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

}  // namespace dc
