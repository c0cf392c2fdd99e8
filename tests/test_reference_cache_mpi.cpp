// The reference cache (capture/reference_cache.h) at N ranks: a hit gives back
// exactly what was stored; another key or build misses; a truncated or
// corrupted file of any rank is detected on every rank and nothing of it is
// used; concurrent writers of one key leave one good entry; eviction keeps
// the bound and the newest entry.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <unistd.h>

#include "harness/capture/reference_cache.h"
#include "harness/capture/tap.h"
#include "harness/core/comm.h"
#include "tests/mpi_world.h"

using namespace dc;
namespace fs = std::filesystem;

namespace {
// A directory every rank uses, fresh for each test, removed at its end.
struct CacheDir {
  std::string path;
  explicit CacheDir(const std::string& name) {
    path = world().broadcast_string(
        world().rank() == 0 ? (fs::temp_directory_path() / fmt::format("dc_refcache_{}_{}", name, getpid())).string()
                            : std::string(),
        0);
    if (world().rank() == 0) fs::remove_all(path);
    world().barrier();
  }
  ~CacheDir() {
    world().barrier();
    if (world().rank() == 0) fs::remove_all(path);
  }
};

Mesh mesh_of_world() { return Mesh::parse(fmt::format("dp={}", world().size())); }

// Rank r holds rows [2r, 2r+2) of a [2N, 3] reference and a whole scalar-like tap on rank 0.
TapRecorder filled(double salt) {
  const int n = world().size(), me = world().rank();
  TapRecorder taps(mesh_of_world(), me, DType::float32);
  RefTensor rows({2, 3});
  for (std::size_t i = 0; i < rows.size(); ++i) rows.data[i] = salt + me * 100.0 + double(i) / 3.0;
  taps.reference_rows("block/out", {std::size_t(2 * n), 3}, std::size_t(2 * me), rows);
  taps.reference("schedule", RefTensor({4}, std::vector<double>{0.1, 0.2, 0.3, salt}));
  // A value the sharded run takes from its reference (a pipeline's latents).
  taps.keep_reference_value("step00/latents_out", RefTensor({3}, std::vector<double>{salt, -me * 1.5, 1e-300}));
  return taps;
}

void expect_same_references(const TapRecorder& a, const TapRecorder& b) {
  ASSERT_EQ(a.references().size(), b.references().size());
  for (const auto& [name, part] : a.references()) {
    const auto& other = b.references().at(name);
    EXPECT_EQ(part.global, other.global) << name;
    ASSERT_EQ(part.blocks.size(), other.blocks.size()) << name;
    for (std::size_t i = 0; i < part.blocks.size(); ++i) {
      EXPECT_EQ(part.blocks[i].start, other.blocks[i].start) << name;
      EXPECT_EQ(part.blocks[i].data.shape, other.blocks[i].data.shape) << name;
      EXPECT_EQ(part.blocks[i].data.data, other.blocks[i].data.data) << name;  // bitwise
    }
  }
  ASSERT_EQ(a.kept_reference_values().size(), b.kept_reference_values().size());
  for (const auto& [name, value] : a.kept_reference_values()) {
    EXPECT_EQ(value.shape, b.kept_reference_value(name).shape) << name;
    EXPECT_EQ(value.data, b.kept_reference_value(name).data) << name;  // bitwise
  }
}

ReferenceCacheSettings settings(const CacheDir& d, std::uint64_t bound = kDefaultReferenceCacheBytes) {
  return {d.path, bound};
}

// As a run does: every rank writes its file, then rank 0 evicts.
void store_everywhere(const ReferenceCache& c, const TapRecorder& taps) {
  c.store(world().rank(), taps);
  world().barrier();
  if (world().rank() == 0) c.evict();
  world().barrier();
}
}  // namespace

TEST(ReferenceCache, HitGivesBackExactlyWhatWasStored) {
  CacheDir dir("hit");
  const ReferenceCache cache(settings(dir), "scenario x\nseed 1\n");
  TapRecorder empty(mesh_of_world(), world().rank(), DType::float32);
  const auto first = cache.load(world(), empty);
  EXPECT_FALSE(first.hit);
  EXPECT_EQ(first.reason, "not in the cache");
  EXPECT_TRUE(empty.references().empty());

  const TapRecorder computed = filled(0.5);
  store_everywhere(cache, computed);
  TapRecorder again(mesh_of_world(), world().rank(), DType::float32);
  const auto second = cache.load(world(), again);
  EXPECT_TRUE(second.hit) << second.reason;
  expect_same_references(computed, again);
  EXPECT_NE(second.summary().find("from the cache"), std::string::npos);
}

TEST(ReferenceCache, AnotherKeyOrBuildMisses) {
  CacheDir dir("keys");
  const ReferenceCache cache(settings(dir), "scenario x\nseed 1\n");
  store_everywhere(cache, filled(0.5));
  for (const auto& other : {"scenario x\nseed 2\n", "scenario x\nseed 1\nsize flux1-dev\n", "scenario y\nseed 1\n"}) {
    const ReferenceCache c(settings(dir), other);
    EXPECT_NE(c.entry_dir(), cache.entry_dir()) << other;
    TapRecorder taps(mesh_of_world(), world().rank(), DType::float32);
    EXPECT_FALSE(c.load(world(), taps).hit) << other;
  }
  // The same key under another build of the executable.
  const ReferenceCache rebuilt(settings(dir), "scenario x\nseed 1\n", "gnu-0123456789abcdef");
  EXPECT_NE(rebuilt.entry_dir(), cache.entry_dir());
  TapRecorder taps(mesh_of_world(), world().rank(), DType::float32);
  EXPECT_FALSE(rebuilt.load(world(), taps).hit);
  EXPECT_FALSE(executable_build_id().empty());
}

TEST(ReferenceCache, DamagedFileOfOneRankIsAMissOnEveryRank) {
  const int victim = world().size() - 1;
  for (const char* damage : {"truncate", "flip", "flip_box", "empty"}) {
    CacheDir dir(std::string("damaged_") + damage);
    const ReferenceCache cache(settings(dir), "scenario x\n");
    store_everywhere(cache, filled(0.25));
    if (world().rank() == victim) {
      const std::string file = fmt::format("{}/rank{}.ref", cache.entry_dir(), victim);
      const auto size = fs::file_size(file);
      if (std::string(damage) == "truncate") {
        fs::resize_file(file, size - 5);
      } else if (std::string(damage) == "empty") {
        fs::resize_file(file, 0);
      } else {  // one bit of the data, not of the header: near the end (a kept value) or in a box
        const auto at = std::streamoff(std::string(damage) == "flip" ? size - 20 : size / 2);
        std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(at);
        char c = 0;
        f.read(&c, 1);
        c = static_cast<char>(c ^ 0x10);
        f.seekp(at);
        f.write(&c, 1);
      }
    }
    world().barrier();
    // Both forms: the boxes read at once, and only checked (a run's).
    for (bool deferred : {false, true}) {
      TapRecorder taps(mesh_of_world(), world().rank(), DType::float32);
      DeferredBoxes later;
      const auto out = deferred ? cache.load(world(), taps, &later) : cache.load(world(), taps);
      EXPECT_FALSE(out.hit) << damage << " deferred " << deferred;
      EXPECT_NE(out.reason.find(fmt::format("damaged on rank {}", victim)), std::string::npos)
          << damage << ": " << out.reason;
      EXPECT_TRUE(taps.references().empty()) << damage;  // nothing of a bad entry is used
      EXPECT_TRUE(taps.kept_reference_values().empty()) << damage;
      EXPECT_FALSE(later.pending()) << damage;
    }
    // Computed again and stored: whole again.
    store_everywhere(cache, filled(0.25));
    TapRecorder again(mesh_of_world(), world().rank(), DType::float32);
    EXPECT_TRUE(cache.load(world(), again).hit) << damage;
  }
}

// The deferred form (what a run uses): the hit is decided on every rank
// first, with the values the sharded run takes at hand and no box in memory;
// the boxes read later are exactly what was stored, also when the entry was
// evicted in between (each rank's file is held open).
TEST(ReferenceCache, DeferredBoxesAreReadLaterEvenAfterEviction) {
  CacheDir dir("deferred");
  const ReferenceCache cache(settings(dir), "scenario x\nseed 3\n");
  const TapRecorder computed = filled(0.75);
  store_everywhere(cache, computed);
  TapRecorder taps(mesh_of_world(), world().rank(), DType::float32);
  DeferredBoxes later;
  const auto out = cache.load(world(), taps, &later);
  ASSERT_TRUE(out.hit) << out.reason;
  EXPECT_TRUE(later.pending());
  EXPECT_TRUE(taps.references().empty());
  EXPECT_EQ(taps.kept_reference_values().size(), computed.kept_reference_values().size());
  world().barrier();
  if (world().rank() == 0) fs::remove_all(cache.entry_dir());
  world().barrier();
  taps.set_references_cached(true);  // as in a run, whose scenario has skipped its references
  later.read_into(world().rank(), taps);
  EXPECT_FALSE(later.pending());
  EXPECT_TRUE(taps.references_cached());
  expect_same_references(computed, taps);
}

TEST(ReferenceCache, ConcurrentWritersOfOneKeyLeaveOneGoodEntry) {
  CacheDir dir("concurrent");
  const ReferenceCache cache(settings(dir), "scenario x\n");
  const TapRecorder taps = filled(1.5);
  std::vector<std::thread> writers;
  for (int i = 0; i < 4; ++i) writers.emplace_back([&] { cache.store(world().rank(), taps); });
  for (auto& t : writers) t.join();
  world().barrier();
  TapRecorder back(mesh_of_world(), world().rank(), DType::float32);
  EXPECT_TRUE(cache.load(world(), back).hit);
  expect_same_references(taps, back);
  // No temporaries left behind.
  for (const auto& e : fs::directory_iterator(cache.entry_dir()))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
}

TEST(ReferenceCache, EvictionKeepsTheBoundAndTheNewest) {
  CacheDir dir("evict");
  // Each entry is a little over N x 200 bytes; a bound of 2.5 entries keeps two.
  const ReferenceCache probe(settings(dir), "entry 0\n");
  store_everywhere(probe, filled(0));
  std::uint64_t entry_bytes = 0;
  for (const auto& e : fs::directory_iterator(probe.entry_dir())) entry_bytes += fs::file_size(e.path());
  const std::uint64_t bound = entry_bytes * 5 / 2;
  std::vector<std::string> entries{probe.entry_dir()};
  for (int k = 1; k < 5; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // distinct modification times
    const ReferenceCache c(settings(dir, bound), fmt::format("entry {}\n", k));
    store_everywhere(c, filled(k));
    entries.push_back(c.entry_dir());
  }
  if (world().rank() == 0) {
    std::uint64_t total = 0;
    for (const auto& e : fs::recursive_directory_iterator(dir.path))
      if (e.is_regular_file()) total += e.file_size();
    EXPECT_LE(total, bound);
    EXPECT_TRUE(fs::exists(entries[4]));  // the newest
    EXPECT_TRUE(fs::exists(entries[3]));
    EXPECT_FALSE(fs::exists(entries[0]));  // the least recently used
  }
  world().barrier();
  // A hit makes an entry the most recently used: it survives the next eviction.
  {
    const ReferenceCache c(settings(dir, bound), "entry 3\n");
    TapRecorder taps(mesh_of_world(), world().rank(), DType::float32);
    EXPECT_TRUE(c.load(world(), taps).hit);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const ReferenceCache newest(settings(dir, bound), "entry 5\n");
  store_everywhere(newest, filled(5));
  if (world().rank() == 0) {
    EXPECT_TRUE(fs::exists(entries[3]));
    EXPECT_FALSE(fs::exists(entries[4]));
    EXPECT_TRUE(fs::exists(newest.entry_dir()));
  }
  world().barrier();
}

TEST(ReferenceCache, OffMeansNoCache) {
  const ReferenceCache cache({"off", kDefaultReferenceCacheBytes}, "scenario x\n");
  TapRecorder taps(mesh_of_world(), world().rank(), DType::float32);
  const auto out = cache.load(world(), taps);
  EXPECT_FALSE(out.hit);
  EXPECT_TRUE(out.entry.empty());
  cache.store(world().rank(), filled(1));  // does nothing
}
