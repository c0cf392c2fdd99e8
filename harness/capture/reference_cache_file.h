// The reference cache's entry files: each rank's references in one file,
// written and read through an XXH3 checksum, headed by a magic and the
// cache key (compared, so a hash collision is a miss); a damaged length
// cannot ask for terabytes. Internal to capture/reference_cache.cpp.
#pragma once
#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/capture/tap.h"
#include "harness/core/error.h"

namespace dc::cache_file {

std::string hex64(std::uint64_t v);

// A file written through a checksum: every byte goes to the file and the hash.
class HashedWriter {
 public:
  explicit HashedWriter(std::FILE* f) : f_(f), st_(XXH3_createState()) { XXH3_64bits_reset(st_); }
  ~HashedWriter() { XXH3_freeState(st_); }
  void put(const void* p, std::size_t n) {
    XXH3_64bits_update(st_, p, n);
    if (std::fwrite(p, 1, n, f_) != n) ok_ = false;
  }
  void u64(std::uint64_t v) { put(&v, sizeof v); }
  void str(const std::string& s) {
    u64(s.size());
    put(s.data(), s.size());
  }
  void dims(const std::vector<std::size_t>& d) {
    u64(d.size());
    for (auto x : d) u64(x);
  }
  // The checksum of everything before it, not itself hashed.
  bool finish() {
    const std::uint64_t h = XXH3_64bits_digest(st_);
    if (std::fwrite(&h, 1, sizeof h, f_) != sizeof h) ok_ = false;
    return ok_;
  }

 private:
  std::FILE* f_;
  XXH3_state_t* st_;
  bool ok_ = true;
};

// The reading side: sizes are checked against what is left of the file
// before anything is allocated, so a damaged length cannot ask for terabytes.
class HashedReader {
 public:
  HashedReader(std::FILE* f, std::uint64_t size) : f_(f), left_(size), st_(XXH3_createState()) {
    XXH3_64bits_reset(st_);
  }
  ~HashedReader() { XXH3_freeState(st_); }
  void get(void* p, std::size_t n) {
    if (n > left_ || std::fread(p, 1, n, f_) != n) throw Error("truncated");
    left_ -= n;
    XXH3_64bits_update(st_, p, n);
  }
  std::uint64_t u64() {
    std::uint64_t v;
    get(&v, sizeof v);
    return v;
  }
  std::uint64_t count(std::uint64_t item_bytes) {
    const std::uint64_t n = u64();
    if (item_bytes && n > left_ / item_bytes) throw Error("a length beyond the file's end");
    return n;
  }
  // Hashes n bytes without keeping them (a bounded buffer).
  void skip(std::size_t n) {
    if (n > left_) throw Error("truncated");
    char buf[1 << 16];
    while (n > 0) {
      const std::size_t k = std::min(n, sizeof buf);
      get(buf, k);
      n -= k;
    }
  }
  std::string str() {
    std::string s(count(1), '\0');
    get(s.data(), s.size());
    return s;
  }
  std::vector<std::size_t> dims() {
    std::vector<std::size_t> d(count(8));
    for (auto& x : d) x = u64();
    return d;
  }
  bool checksum_matches() {
    const std::uint64_t want = XXH3_64bits_digest(st_);
    std::uint64_t got;
    if (left_ != 0 || std::fread(&got, 1, sizeof got, f_) != sizeof got) return false;
    return got == want;
  }
  std::uint64_t left() const { return left_; }

 private:
  std::FILE* f_;
  std::uint64_t left_;
  XXH3_state_t* st_;
};

using ReferenceMap = std::map<std::string, ReferencePart>;

// What one rank's file holds.
struct EntryFile {
  ReferenceMap refs;
  std::map<std::string, RefTensor> kept;
};

// The file's length less its checksum; throws when too short to be one.
std::uint64_t checked_length(std::FILE* f);
void read_header(HashedReader& in, const std::string& key_text);
void write_header(HashedWriter& w, const std::string& key_text);

// What read_entry_file keeps of a whole, checked file.
struct Keep {
  bool boxes = true;
  bool kept = true;
};

// Reads one rank's file; throws Error (a short reason) when it is not a
// whole file of this key.
EntryFile read_entry_file(std::FILE* f, const std::string& key_text, int rank, Keep keep);

using File = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;
File open_entry_file(const std::string& path);

}  // namespace dc::cache_file
