// Reports (JSON, JUnit, HTML) are written whole or not at all: into
// "<path>.tmp", then renamed, so a reader never sees half a file.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "harness/core/comm.h"

namespace dc {

// Throws Error naming the file and `what` (e.g. "HTML report") when it cannot.
void write_whole_file(const std::string& path, const std::string& text, const std::string& what);

// The whole of a text file. Throws InputError naming `what` and the file.
std::string read_text_file(const std::string& path, const std::string& what);

// Whether every rank of `world` sees the same directory `dir` (a shared
// filesystem) rather than one of its own host's (node-local /tmp): rank 0
// writes a probe file with a token no earlier run could have left, the others
// look for it. Collective; the same answer on every rank. `dir` must exist on
// every rank.
bool directory_shared(const Comm& world, const std::string& dir);

// Bytes an unprivileged writer may still put into the filesystem holding
// `dir` (statvfs); nothing when it cannot say (no such directory: the write
// that follows names its own error).
std::optional<std::uint64_t> available_bytes(const std::string& dir);

}  // namespace dc
