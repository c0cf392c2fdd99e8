#include <gtest/gtest.h>

#include "harness/core/error.h"
#include "harness/core/layout.h"

using dc::Layout;
using dc::Mesh;

TEST(Layout, ParsesSpecAndPartial) {
  Layout l = Layout::parse("-,fsdp*sp, tp", "dp");
  ASSERT_EQ(l.spec.size(), 3u);
  EXPECT_TRUE(l.spec[0].empty());
  EXPECT_EQ(l.spec[1], (std::vector<std::string>{"fsdp", "sp"}));
  EXPECT_EQ(l.spec_str(), "-,fsdp*sp,tp");
  EXPECT_EQ(l.partial_str(), "dp");
  EXPECT_TRUE(Layout::parse("", "").spec.empty());
}

TEST(Layout, ValidateRejectsUnknownDuplicateAndTooManyDims) {
  Mesh m = Mesh::parse("dp=2,tp=2");
  EXPECT_THROW(Layout::parse("xx", "").validate(m, 1), dc::InputError);
  EXPECT_THROW(Layout::parse("tp", "tp").validate(m, 1), dc::InputError);
  EXPECT_THROW(Layout::parse("dp,tp,-", "").validate(m, 2), dc::InputError);
  EXPECT_THROW(Layout::parse("d p", ""), dc::InputError);
  EXPECT_NO_THROW(Layout::parse("dp", "tp").validate(m, 3));
}

TEST(Layout, ReplicaAxesAndLeaders) {
  Mesh m = Mesh::parse("dp=2,tp=4");
  Layout l = Layout::parse("-,tp", "");
  EXPECT_EQ(l.replica_axes(m), (std::vector<std::string>{"dp"}));
  EXPECT_EQ(l.replica_leader(m, 6), 2);
  EXPECT_EQ(l.replica_group(m, 6), (std::vector<int>{2, 6}));
  EXPECT_EQ(Layout::replicated().replica_leader(m, 7), 0);
}

TEST(Layout, GlobalShapeAndBlocksForMultiAxisDims) {
  Mesh m = Mesh::parse("dp=2,fsdp=2,sp=2,tp=2");
  Layout l = Layout::parse("fsdp*sp,tp", "");
  EXPECT_EQ(l.global_shape(m, {3, 5}), (dc::Shape{12, 10}));
  // rank 6 = (0,1,1,0): h-block fsdp*2+sp = 3, f-block 0 (SCENARIOS §4 table)
  EXPECT_EQ(l.block_of(m, 6, 2), (std::vector<std::size_t>{3, 0}));
  EXPECT_EQ(l.block_of(m, 1, 2), (std::vector<std::size_t>{0, 1}));
}

TEST(Layout, ReassemblePlacesBlocksAndSumsPartials) {
  // mesh dp=2 (partial), tp=2 (splits dim 1). Global [2,4]; local [2,2].
  Mesh m = Mesh::parse("dp=2,tp=2");
  Layout l = Layout::parse("-,tp", "dp");
  std::vector<std::vector<double>> pieces(4);
  for (int r = 0; r < 4; ++r) {
    auto c = m.coords(r);
    for (int i = 0; i < 4; ++i) pieces[r].push_back(100 * c[0] + 10 * c[1] + i);
  }
  auto g = dc::reassemble(l, m, {2, 2}, [&](int r) { return pieces[r].data(); });
  // element (row i, col j): tp block j/2, local (i, j%2) -> local flat 2i + j%2
  std::vector<double> want;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      double tp = j / 2, loc = 2 * i + j % 2;
      want.push_back((0 + 10 * tp + loc) + (100 + 10 * tp + loc));
    }
  EXPECT_EQ(g, want);
}

TEST(Layout, ReassembleUsesReplicaLeadersOnly) {
  Mesh m = Mesh::parse("dp=2");
  Layout l = Layout::replicated();
  std::vector<std::vector<double>> pieces = {{1, 2}, {7, 7}};
  auto g = dc::reassemble(l, m, {2}, [&](int r) { return pieces[r].data(); });
  EXPECT_EQ(g, (std::vector<double>{1, 2}));
}
