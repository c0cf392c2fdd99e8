// Run-file round trip: write with parallel HDF5 at N ranks, read back on rank 0.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <optional>

#include "harness/core/comm.h"
#include "harness/core/error.h"
#include "harness/capture/store.h"
#include "tests/mpi_world.h"

using namespace dc;

namespace {
std::string temp_path(const std::string& name) {
  // Same path on every rank: rank 0 picks it.
  std::string p = world().rank() == 0
                      ? (std::filesystem::temp_directory_path() /
                         fmt::format("diffcheck_{}_{}.h5", name, ::getpid()))
                            .string()
                      : "";
  return world().broadcast_string(p, 0);
}
}  // namespace

// Every way of writing a run file, by name (for the failure messages).
const std::vector<std::pair<WriteMode, std::string>> kModes{
    {WriteMode::collective, "mpiio"}, {WriteMode::gathered, "gather"}, {WriteMode::positional, "pwrite"}};

TEST(Store, RunFileRoundTrip) {
 for (const auto& [mode, mode_name] : kModes) {
  SCOPED_TRACE(mode_name);
  const int n = world().size(), me = world().rank();
  Mesh mesh = Mesh::parse(fmt::format("dp=1,tp={}", n));
  TapRecorder taps(mesh, me, DType::bfloat16);
  Tensor sharded({2, 3});
  for (int i = 0; i < 6; ++i) sharded.data[i] = static_cast<float>(me * 10 + i);
  taps.tap("block0/attn/q", sharded, {.layout = Layout::parse("-,tp", ""), .reduction_depth = 64});
  Tensor rep({4}, 1.5f);
  taps.tap("scalar_like", rep, {.atol = 0.25});
  RefTensor ref({2, static_cast<std::size_t>(3 * n)}, 0.0);
  for (std::size_t i = 0; i < ref.size(); ++i) ref.data[i] = static_cast<double>(i) + 0.5;
  taps.reference("block0/attn/q", ref);

  std::string path = temp_path("roundtrip");
  write_run_file(world(), path, {"unit", "a=1", "bfloat16", 9, "test"}, taps, mode);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  int ok = 1;
  if (me == 0) {
    ActivationSet s = read_activations(path);
    EXPECT_EQ(s.world_size, n);
    EXPECT_EQ(s.mesh.str(), mesh.str());
    EXPECT_EQ(s.info["scenario"], "unit");
    EXPECT_EQ(s.info["seed"], "9");
    EXPECT_EQ(s.info["flags"], "a=1");
    if (s.taps.size() == 2) {
      const auto& q = s.taps[0];
      EXPECT_EQ(q.name, "block0/attn/q");
      EXPECT_EQ(q.layout.spec_str(), "-,tp");
      EXPECT_EQ(q.dtype, "bfloat16");
      EXPECT_EQ(q.stored, StoredKind::float32);
      EXPECT_EQ(q.reduction_depth.value_or(0), 64);
      EXPECT_EQ(q.local_shape, (Shape{2, 3}));
      for (int r = 0; r < n; ++r) EXPECT_EQ(read_whole_piece(s, q, r)[5], r * 10 + 5);
      ASSERT_TRUE(q.reference_shape);
      EXPECT_EQ(read_whole_reference(s, q), ref.data);
      EXPECT_EQ(s.taps[1].name, "scalar_like");
      EXPECT_EQ(s.taps[1].atol.value_or(-1), 0.25);
      EXPECT_FALSE(s.taps[1].reference_shape);
    } else {
      ok = 0;
      ADD_FAILURE() << "expected 2 taps, got " << s.taps.size();
    }
    std::filesystem::remove(path);
  }
  world().barrier();
  (void)ok;
 }
}

TEST(Store, RanksRecordingDifferentTapsIsAnError) {
  if (world().size() < 2) GTEST_SKIP() << "needs two ranks";
  Mesh mesh = Mesh::parse(fmt::format("dp={}", world().size()));
  TapRecorder taps(mesh, world().rank(), DType::float32);
  taps.tap(world().rank() == 1 ? "other" : "x", Tensor({2}, 1.0f));
  std::string path = temp_path("mismatch");
  EXPECT_THROW(write_run_file(world(), path, {}, taps), Error);
  EXPECT_FALSE(std::filesystem::exists(path));
}

// References computed row by row on different ranks (each rank some rows,
// rank 0 possibly several) land whole in the file.
TEST(Store, ReferenceRowsFromEveryRank) {
 for (const auto& [mode, mode_name] : kModes) {
  SCOPED_TRACE(mode_name);
  const int n = world().size(), me = world().rank();
  Mesh mesh = Mesh::parse(fmt::format("dp={}", n));
  TapRecorder taps(mesh, me, DType::float32);
  const std::size_t rows = static_cast<std::size_t>(2 * n + 1);  // rank 0 gets three rows
  taps.tap("y", Tensor({rows, 3, 2}, 1.0f));  // replicated: global = local
  RefTensor want({rows, 3, 2}, 0.0);
  for (std::size_t i = 0; i < want.size(); ++i) want.data[i] = static_cast<double>(i) * 0.25;
  for (std::size_t r : taps.my_reference_rows(rows)) {
    RefTensor item({3, 2}, 0.0);
    std::copy_n(want.data.begin() + static_cast<long>(r * 6), 6, item.data.begin());
    taps.reference_row("y", rows, r, item);
  }
  std::string path = temp_path("rows");
  write_run_file(world(), path, {"unit", "", "float32", 1, "test"}, taps, mode);
  if (me == 0) {
    ActivationSet s = read_activations(path);
    ASSERT_EQ(s.taps.size(), 1u);
    ASSERT_TRUE(s.taps[0].reference_shape);
    EXPECT_EQ(*s.taps[0].reference_shape, (Shape{rows, 3, 2}));
    EXPECT_EQ(read_whole_reference(s, s.taps[0]), want.data);
    std::filesystem::remove(path);
  }
  world().barrier();
 }
}

// Boxes of a [B, N, 3] reference: each rank holds token `rank` of both
// samples, two boxes that are not contiguous in the file (two collective
// writes, the second with nothing from ranks that hold one box).
TEST(Store, ReferenceBoxesFromEveryRank) {
 for (const auto& [mode, mode_name] : kModes) {
  SCOPED_TRACE(mode_name);
  const int n = world().size(), me = world().rank();
  Mesh mesh = Mesh::parse(fmt::format("dp={}", n));
  TapRecorder taps(mesh, me, DType::float32);
  const std::size_t tokens = static_cast<std::size_t>(n);
  taps.tap("y", Tensor({2, tokens, 3}, 1.0f));
  RefTensor want({2, tokens, 3}, 0.0);
  for (std::size_t i = 0; i < want.size(); ++i) want.data[i] = static_cast<double>(i) + 0.5;
  for (std::size_t b = 0; b < 2; ++b) {
    if (b == 1 && me == 1) continue;  // rank 0 takes this one: it holds three boxes
    const std::size_t t = static_cast<std::size_t>(me);
    RefTensor box({1, 1, 3}, 0.0);
    std::copy_n(want.data.begin() + static_cast<long>((b * tokens + t) * 3), 3, box.data.begin());
    taps.reference_block("y", want.shape, {b, t, 0}, box);
    if (b == 1 && me == 0 && n > 1) {
      std::copy_n(want.data.begin() + static_cast<long>((b * tokens + 1) * 3), 3, box.data.begin());
      taps.reference_block("y", want.shape, {b, 1, 0}, box);
    }
  }
  std::string path = temp_path("boxes");
  write_run_file(world(), path, {"unit", "", "float32", 1, "test"}, taps, mode);
  if (me == 0) {
    ActivationSet s = read_activations(path);
    EXPECT_EQ(read_whole_reference(s, s.taps[0]), want.data);
    std::filesystem::remove(path);
  }
  world().barrier();
 }
}

// --store pwrite at the sizes where its buffering matters: tap rows larger
// than the 8 MiB staging buffer and not a whole number of pages (so ranks
// share the pages at their rows' ends), and reference boxes split inside
// their last dimension (runs of 515 doubles, 4120 bytes, each crossing a page
// boundary), with O_DIRECT and with the page cache alone
// (DIFFCHECK_DIRECT_IO=0); the file must hold exactly what was written. Also
// begun before the references exist (begin_run_file: the taps' rows going
// out while the references are made, which are added to the file after).
TEST(Store, PositionalWriteOfUnalignedRowsAndSplitBoxes) {
  const int n = world().size(), me = world().rank();
  for (const char* direct : {"1", "0"})
  for (const bool begin_early : {false, true}) {
    SCOPED_TRACE(std::string("DIFFCHECK_DIRECT_IO=") + direct + (begin_early ? ", begun before the references" : ""));
    setenv("DIFFCHECK_DIRECT_IO", direct, 1);
    std::string path = temp_path("positional");
    const RunInfo info{"unit", "", "float32", 1, "test"};
    Mesh mesh = Mesh::parse(fmt::format("dp={}", n));
    TapRecorder taps(mesh, me, DType::float32);
    const std::size_t row = (std::size_t{3} << 20) + 5;  // 12 MiB + 20 bytes
    Tensor big({row});
    for (std::size_t i = 0; i < row; ++i) big.data[i] = static_cast<float>(me) * 1e7f + static_cast<float>(i % 9973);
    taps.tap("big", big, {.layout = Layout::parse("dp", "")});
    taps.tap("y", Tensor({1, 6, 1030}, 1.0f), {.layout = Layout::parse("dp,-,-", "")});
    std::optional<PendingRunFile> begun;
    if (begin_early) {
      taps.all_taps_recorded();
      begun.emplace(begin_run_file(world(), path, info, taps));
      EXPECT_THROW(taps.tap("late", Tensor({1}, 1.0f)), Error);  // the file has no room for it
    }
    const std::size_t N = static_cast<std::size_t>(n);
    RefTensor want({N, 6, 1030}, 0.0);
    for (std::size_t i = 0; i < want.size(); ++i) want.data[i] = static_cast<double>(i) + 0.25;
    for (std::size_t half = 0; half < 2; ++half) {  // rank r: [r, :, 0:515] and [r, :, 515:1030]
      RefTensor box({1, 6, 515}, 0.0);
      for (std::size_t j = 0; j < 6; ++j)
        std::copy_n(want.data.begin() + static_cast<long>((static_cast<std::size_t>(me) * 6 + j) * 1030 + half * 515),
                    515, box.data.begin() + static_cast<long>(j * 515));
      taps.reference_block("y", want.shape, {static_cast<std::size_t>(me), 0, half * 515}, box);
    }
    if (begun)
      start_run_file(world(), path, info, taps, WriteMode::positional, {}, &*begun).finish();
    else
      write_run_file(world(), path, info, taps, WriteMode::positional);
    if (me == 0) {
      ActivationSet s = read_activations(path);
      ASSERT_EQ(s.taps.size(), 2u);
      EXPECT_EQ(s.info["scenario"], "unit");
      for (int r = 0; r < n; ++r) {
        const auto piece = read_whole_piece(s, s.taps[0], r);
        ASSERT_EQ(piece.size(), row);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < row; ++i)
          wrong += piece[i] != static_cast<float>(r) * 1e7f + static_cast<float>(i % 9973);
        EXPECT_EQ(wrong, 0u) << "rank " << r << "'s row";
      }
      EXPECT_EQ(read_whole_reference(s, s.taps[1]), want.data);
      std::filesystem::remove(path);
    }
    world().barrier();
  }
  unsetenv("DIFFCHECK_DIRECT_IO");
}

// A row nobody computed would read as zeros: every rank refuses instead.
TEST(Store, MissingReferenceRowsAreAnError) {
  const int n = world().size(), me = world().rank();
  Mesh mesh = Mesh::parse(fmt::format("dp={}", n));
  TapRecorder taps(mesh, me, DType::float32);
  taps.tap("y", Tensor({2}, 1.0f));
  for (std::size_t r : taps.my_reference_rows(static_cast<std::size_t>(n)))
    if (r != 0) taps.reference_row("y", static_cast<std::size_t>(n) + 1, r, RefTensor({2}, 1.0));
  if (me == 0) taps.reference_row("y", static_cast<std::size_t>(n) + 1, 0, RefTensor({2}, 1.0));
  std::string path = temp_path("missing_rows");
  try {
    write_run_file(world(), path, {}, taps);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reference of tap 'y'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  world().barrier();
}

TEST(TapRecorder, ReferenceRowsOverlappingOrMisshapenAreRefused) {
  Mesh mesh = Mesh::parse("dp=1");
  TapRecorder taps(mesh, 0, DType::float32);
  taps.reference_row("y", 4, 1, RefTensor({2}, 1.0));
  EXPECT_THROW(taps.reference_row("y", 4, 1, RefTensor({2}, 1.0)), Error);
  EXPECT_THROW(taps.reference_row("y", 4, 4, RefTensor({2}, 1.0)), Error);
  EXPECT_THROW(taps.reference_row("y", 5, 2, RefTensor({2}, 1.0)), Error);  // other shape
  EXPECT_THROW(taps.reference_rows("y", {4, 2}, 2, RefTensor({2, 3}, 1.0)), Error);
  // Boxes: overlapping, or not fitting the whole.
  taps.reference_block("z", {2, 4, 3}, {0, 0, 0}, RefTensor({1, 2, 3}, 1.0));
  taps.reference_block("z", {2, 4, 3}, {1, 0, 0}, RefTensor({1, 2, 3}, 1.0));
  EXPECT_THROW(taps.reference_block("z", {2, 4, 3}, {0, 1, 0}, RefTensor({1, 2, 3}, 1.0)), Error);
  EXPECT_THROW(taps.reference_block("z", {2, 4, 3}, {0, 3, 0}, RefTensor({1, 2, 3}, 1.0)), Error);
  EXPECT_THROW(taps.reference_block("z", {2, 4, 3}, {0, 2}, RefTensor({1, 2, 3}, 1.0)), Error);
  taps.reference_block("z", {2, 4, 3}, {0, 2, 0}, RefTensor({1, 2, 3}, 1.0));
}

// A tensor the scenario is done with moves into its tap: at flux1-dev size a
// copy is GBs of new pages. A tensor still in use is copied, as before.
TEST(TapRecorder, ATensorGivenUpMovesInAndOneStillInUseIsCopied) {
  Mesh mesh = Mesh::parse("dp=1");
  TapRecorder taps(mesh, 0, DType::float32);
  Tensor moved({3, 4}, 1.0f);
  const float* where = moved.data.data();
  taps.tap("moved", std::move(moved));
  EXPECT_EQ(taps.records().back().local.data.data(), where);
  Tensor kept({3, 4}, 2.0f);
  taps.tap("kept", kept);
  EXPECT_NE(taps.records().back().local.data.data(), kept.data.data());
  EXPECT_EQ(taps.records().back().local.data, kept.data);
}
