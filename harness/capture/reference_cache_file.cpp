// The reference cache's entry files (capture/reference_cache_file.h).
#include "harness/capture/reference_cache_file.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

#include <sys/stat.h>

namespace dc::cache_file {

// 02: the references are followed by the values kept for the sharded run
// (TapRecorder::keep_reference_value).
constexpr char kMagic[8] = {'D', 'C', 'R', 'E', 'F', 'C', '0', '2'};

std::string hex64(std::uint64_t v) { return fmt::format("{:016x}", v); }

std::uint64_t checked_length(std::FILE* f) {
  struct stat st {};
  if (fstat(fileno(f), &st) != 0 || st.st_size < 16) throw Error("truncated");
  return static_cast<std::uint64_t>(st.st_size) - sizeof(std::uint64_t);
}

void read_header(HashedReader& in, const std::string& key_text) {
  char magic[sizeof kMagic];
  in.get(magic, sizeof magic);
  if (std::memcmp(magic, kMagic, sizeof kMagic) != 0) throw Error("not a diffcheck reference-cache file");
  if (in.str() != key_text) throw Error("another key (a hash collision)");
}

void write_header(HashedWriter& w, const std::string& key_text) {
  w.put(kMagic, sizeof kMagic);
  w.str(key_text);
}

// Reads one rank's file; throws Error (a short reason) when it is not a whole
// file of this key.
// `keep` false: the values are checked (hashed) but not kept; an empty tensor
// of the shape is returned.
RefTensor read_tensor(HashedReader& in, bool keep = true) {
  Shape shape = in.dims();
  const std::size_t n = numel(shape);
  if (n > in.left() / sizeof(double)) throw Error("a block beyond the file's end");
  if (!keep) {
    in.skip(n * sizeof(double));
    return RefTensor();
  }
  RefTensor t(std::move(shape));
  in.get(t.ptr(), n * sizeof(double));
  return t;
}

EntryFile read_entry_file(std::FILE* f, const std::string& key_text, int rank, Keep keep) {
  HashedReader in(f, checked_length(f));
  read_header(in, key_text);
  if (in.u64() != static_cast<std::uint64_t>(rank)) throw Error("another rank's file");
  EntryFile out;
  const std::uint64_t parts = in.count(8);
  for (std::uint64_t p = 0; p < parts; ++p) {
    std::string name = in.str();
    ReferencePart part;
    part.global = in.dims();
    const std::uint64_t blocks = in.count(8);
    for (std::uint64_t b = 0; b < blocks; ++b) {
      ReferenceBlock block;
      block.start = in.dims();
      block.data = read_tensor(in, keep.boxes);
      if (keep.boxes) part.blocks.push_back(std::move(block));
    }
    out.refs.emplace(std::move(name), std::move(part));
  }
  const std::uint64_t kept = in.count(8);
  for (std::uint64_t k = 0; k < kept; ++k) {
    std::string name = in.str();
    RefTensor value = read_tensor(in, keep.kept);
    if (keep.kept) out.kept.emplace(std::move(name), std::move(value));
  }
  if (!in.checksum_matches()) throw Error("checksum mismatch (damaged)");
  return out;
}

File open_entry_file(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) throw Error(errno == ENOENT ? "no entry" : fmt::format("cannot open: {}", std::strerror(errno)));
  return f;
}

}  // namespace dc::cache_file
