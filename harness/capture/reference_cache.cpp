#include "harness/capture/reference_cache.h"

#include <fmt/format.h>
#include <link.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <system_error>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "harness/capture/reference_cache_file.h"
#include "harness/capture/tap.h"
#include "harness/core/error.h"

namespace dc {
namespace fs = std::filesystem;

namespace {

using namespace cache_file;

// The GNU build-id note of the main program, from its program headers.
int find_build_id(struct dl_phdr_info* info, std::size_t, void* out) {
  if (info->dlpi_name && info->dlpi_name[0]) return 0;  // a shared library: not the executable
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
    const char* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const auto* n = reinterpret_cast<const ElfW(Nhdr)*>(p);
      const char* name = p + sizeof(ElfW(Nhdr));
      const char* desc = name + ((n->n_namesz + 3) & ~3u);
      if (n->n_type == NT_GNU_BUILD_ID && n->n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0 &&
          desc + n->n_descsz <= end) {
        auto* s = static_cast<std::string*>(out);
        for (unsigned k = 0; k < n->n_descsz; ++k) *s += fmt::format("{:02x}", static_cast<unsigned char>(desc[k]));
        return 1;
      }
      p = desc + ((n->n_descsz + 3) & ~3u);
    }
  }
  return 0;
}

std::string hash_of_executable() {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen("/proc/self/exe", "rb"), std::fclose);
  if (!f) return "unknown-build";
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<char> buf(1 << 20);
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) XXH3_64bits_update(st, buf.data(), n);
  const auto h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return "exe-" + hex64(h);
}

std::uint64_t tree_bytes(const fs::path& p) {
  std::uint64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e2;
    if (it->is_regular_file(e2)) total += it->file_size(e2);
  }
  return total;
}

}  // namespace

std::string ReferenceCacheOutcome::summary() const {
  if (hit) return fmt::format("reference: from the cache ({})", entry);
  if (entry.empty()) return "reference: computed (no cache)";
  return fmt::format("reference: computed ({}), stored in the cache ({})", reason, entry);
}

std::string default_reference_cache_dir() {
  if (const char* env = std::getenv("DIFFCHECK_REFERENCE_CACHE"); env && *env)
    return std::string(env) == "off" ? "off" : fs::absolute(env).lexically_normal().string();
  return (fs::current_path() / "results" / "cache").string();
}

const std::string& executable_build_id() {
  static const std::string id = [] {
    std::string s;
    dl_iterate_phdr(find_build_id, &s);
    return s.empty() ? hash_of_executable() : "gnu-" + s;
  }();
  return id;
}

ReferenceCache::ReferenceCache(ReferenceCacheSettings settings, std::string key_text, const std::string& build)
    : settings_(std::move(settings)), key_text_("diffcheck reference cache 1\nbuild " + build + "\n" + std::move(key_text)) {
  if (settings_.enabled())
    entry_ = (fs::path(settings_.dir) / hex64(XXH3_64bits(key_text_.data(), key_text_.size()))).string();
}

std::string ReferenceCache::rank_file(int rank) const { return fmt::format("{}/rank{}.ref", entry_, rank); }

ReferenceCacheOutcome ReferenceCache::load(const Comm& world, TapRecorder& taps) const {
  return load(world, taps, nullptr);
}

ReferenceCacheOutcome ReferenceCache::load(const Comm& world, TapRecorder& taps, DeferredBoxes* deferred) const {
  ReferenceCacheOutcome out;
  if (!settings_.enabled()) return out;
  out.entry = entry_;
  std::string mine;  // this rank's reason for a miss
  EntryFile file;
  File f(nullptr, std::fclose);
  try {
    f = open_entry_file(rank_file(world.rank()));
    file = read_entry_file(f.get(), key_text_, world.rank(), Keep{.boxes = deferred == nullptr});
  } catch (const std::exception& e) {
    mine = e.what();
    file = {};
  }
  if (!mine.empty() && mine != "no entry")
    spdlog::warn("rank {}: reference cache entry {}: {}: computing the references again", world.rank(),
                 rank_file(world.rank()), mine);
  // Every rank must take the same path: the references' computation has collectives.
  const auto reasons = world.all_gather_strings(mine);
  for (std::size_t r = 0; r < reasons.size(); ++r) {
    if (reasons[r].empty()) continue;
    out.reason = reasons[r] == "no entry" ? "not in the cache" : fmt::format("entry damaged on rank {}: {}", r, reasons[r]);
    if (reasons[r] != "no entry") break;
  }
  if (!out.reason.empty()) return out;
  for (auto& [name, part] : file.refs)
    for (auto& block : part.blocks) taps.reference_block(name, part.global, std::move(block.start), std::move(block.data));
  for (auto& [name, value] : file.kept) taps.keep_reference_value(name, std::move(value));
  out.hit = true;
  if (deferred) {
    deferred->file_ = std::shared_ptr<std::FILE>(f.release(), std::fclose);
    deferred->key_text_ = key_text_;
    deferred->path_ = rank_file(world.rank());
  }
  if (world.rank() == 0) {
    std::error_code ec;
    fs::last_write_time(entry_, fs::file_time_type::clock::now(), ec);  // most recently used
  }
  return out;
}

void DeferredBoxes::read_into(int rank, TapRecorder& taps) {
  if (!file_) return;
  std::rewind(file_.get());
  EntryFile file;
  try {
    file = read_entry_file(file_.get(), key_text_, rank, Keep{.boxes = true, .kept = false});
  } catch (const std::exception& e) {
    fail("rank {}: reference cache entry {} changed after it was checked: {}", rank, path_, e.what());
  }
  file_.reset();
  // The recorder refuses references while they count as cached (a
  // scenario's guard): these are the cached ones.
  const bool cached = taps.references_cached();
  taps.set_references_cached(false);
  for (auto& [name, part] : file.refs)
    for (auto& block : part.blocks) taps.reference_block(name, part.global, std::move(block.start), std::move(block.data));
  taps.set_references_cached(cached);
}

void ReferenceCache::store(int rank, const TapRecorder& taps) const {
  if (!settings_.enabled()) return;
  std::string problem;
  std::error_code ec;
  fs::create_directories(entry_, ec);
  const std::string path = rank_file(rank);
  const std::string tmp = fmt::format("{}.tmp.{}.{:x}", path, getpid(), std::random_device{}());
  if (ec) {
    problem = fmt::format("cannot make {}: {}", entry_, ec.message());
  } else if (std::FILE* f = std::fopen(tmp.c_str(), "wb")) {
    HashedWriter w(f);
    write_header(w, key_text_);
    w.u64(static_cast<std::uint64_t>(rank));
    w.u64(taps.references().size());
    for (const auto& [name, part] : taps.references()) {
      w.str(name);
      w.dims(part.global);
      w.u64(part.blocks.size());
      for (const auto& b : part.blocks) {
        w.dims(b.start);
        w.dims(b.data.shape);
        w.put(b.data.ptr(), b.data.size() * sizeof(double));
      }
    }
    w.u64(taps.kept_reference_values().size());
    for (const auto& [name, value] : taps.kept_reference_values()) {
      w.str(name);
      w.dims(value.shape);
      w.put(value.ptr(), value.size() * sizeof(double));
    }
    const bool ok = w.finish();
    if (std::fclose(f) != 0 || !ok) {
      problem = fmt::format("cannot write {}: {}", tmp, std::strerror(errno));
      fs::remove(tmp, ec);
    } else {
      fs::rename(tmp, path, ec);
      if (ec) problem = fmt::format("cannot rename {} to {}: {}", tmp, path, ec.message());
    }
  } else {
    problem = fmt::format("cannot create {}: {}", tmp, std::strerror(errno));
  }
  if (!problem.empty()) spdlog::warn("rank {}: reference cache: {} (the run goes on)", rank, problem);
}

std::optional<std::string> ReferenceCache::load_text(const std::string& name) const {
  if (!settings_.enabled()) return std::nullopt;
  const std::string path = fmt::format("{}/{}", entry_, name);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) return std::nullopt;
  try {
    HashedReader in(f.get(), checked_length(f.get()));
    read_header(in, key_text_);
    std::string text = in.str();
    if (!in.checksum_matches()) throw Error("checksum mismatch (damaged)");
    std::error_code ec;
    fs::last_write_time(entry_, fs::file_time_type::clock::now(), ec);
    return text;
  } catch (const std::exception& e) {
    spdlog::warn("reference cache entry {}: {}: measuring again", path, e.what());
    return std::nullopt;
  }
}

void ReferenceCache::store_text(const std::string& name, const std::string& text) const {
  if (!settings_.enabled()) return;
  std::error_code ec;
  fs::create_directories(entry_, ec);
  const std::string path = fmt::format("{}/{}", entry_, name);
  const std::string tmp = fmt::format("{}.tmp.{}.{:x}", path, getpid(), std::random_device{}());
  std::FILE* f = ec ? nullptr : std::fopen(tmp.c_str(), "wb");
  bool ok = f != nullptr;
  if (f) {
    HashedWriter w(f);
    write_header(w, key_text_);
    w.str(text);
    ok = w.finish();
    ok = std::fclose(f) == 0 && ok;
    if (ok) fs::rename(tmp, path, ec), ok = !ec;
    if (!ok) fs::remove(tmp, ec);
  }
  if (!ok) spdlog::warn("reference cache: cannot write {} (the run goes on)", path);
}

void ReferenceCache::evict() const {
  if (!settings_.enabled()) return;
  const int removed = evict_reference_cache(settings_.dir, settings_.max_bytes, entry_);
  if (removed) spdlog::info("reference cache {}: removed {} least recently used entries", settings_.dir, removed);
}

int evict_reference_cache(const std::string& dir, std::uint64_t max_bytes, const std::string& keep) {
  struct Entry {
    fs::path path;
    fs::file_time_type used;
    std::uint64_t bytes;
  };
  std::vector<Entry> entries;
  std::uint64_t total = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e2;
    if (!it->is_directory(e2)) continue;
    Entry e{it->path(), fs::last_write_time(it->path(), e2), tree_bytes(it->path())};
    if (e2) continue;  // removed meanwhile by another run
    total += e.bytes;
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.used < b.used; });
  int removed = 0;
  for (const auto& e : entries) {
    if (total <= max_bytes) break;
    if (fs::path(keep) == e.path) continue;
    std::error_code e2;
    fs::remove_all(e.path, e2);  // another evictor may be removing it too
    total -= e.bytes;
    ++removed;
  }
  return removed;
}

}  // namespace dc
