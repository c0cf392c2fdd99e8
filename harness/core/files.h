// Reports (JSON, JUnit, HTML) are written whole or not at all: into
// "<path>.tmp", then renamed, so a reader never sees half a file.
#pragma once
#include <string>

namespace dc {

// Throws Error naming the file and `what` (e.g. "HTML report") when it cannot.
void write_whole_file(const std::string& path, const std::string& text, const std::string& what);

}  // namespace dc
