#include <gtest/gtest.h>

#include "harness/core/error.h"
#include "harness/core/mesh.h"

using dc::Mesh;

TEST(Mesh, ParsesAxesInOrder) {
  Mesh m = Mesh::parse("dp=2,fsdp=2,sp=2,tp=2");
  ASSERT_EQ(m.axes().size(), 4u);
  EXPECT_EQ(m.axes()[2].name, "sp");
  EXPECT_EQ(m.world_size(), 16);
  EXPECT_EQ(m.str(), "dp=2,fsdp=2,sp=2,tp=2");
}

TEST(Mesh, LastAxisVariesFastest) {
  Mesh m = Mesh::parse("dp=2,tp=4");
  EXPECT_EQ(m.coords(6), (std::vector<int>{1, 2}));  // the SCHEMA example
  EXPECT_EQ(m.coords(3), (std::vector<int>{0, 3}));
  for (int r = 0; r < 8; ++r) EXPECT_EQ(m.rank_of(m.coords(r)), r);
}

TEST(Mesh, GroupsAndIndices) {
  Mesh m = Mesh::parse("dp=2,fsdp=2,sp=2,tp=2");
  // rank 5 = (0,1,0,1); its fsdp*sp group varies fsdp and sp.
  EXPECT_EQ(m.group(5, {"fsdp", "sp"}), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(m.group(5, {"dp"}), (std::vector<int>{5, 13}));
  EXPECT_EQ(m.index_in(6, {"fsdp", "sp"}), 3);  // (0,1,1,0): fsdp major
  EXPECT_EQ(m.index_in(4, {"fsdp", "sp"}), 2);  // (0,1,0,0): fsdp major
  EXPECT_EQ(m.index_in(4, {"sp", "fsdp"}), 1);  // sp major
}

TEST(Mesh, RejectsBadStrings) {
  for (const char* bad : {"", "dp", "dp=0", "dp=-1", "dp=x", "1dp=2", "dp=2,dp=2", "dp=2,,tp=2",
                          "d-p=2"})
    EXPECT_THROW(Mesh::parse(bad), dc::InputError) << bad;
}

// Found by tests/fuzz (fuzz_parsers): the world size overflowed int.
TEST(Mesh, MoreRanksThanAnIntHoldsIsRefused) {
  EXPECT_THROW(Mesh::parse("cI=6622222,SSSSSSSI=65,SS=6"), dc::InputError);
  EXPECT_THROW(Mesh::parse("a=65536,b=32768"), dc::InputError);
  EXPECT_EQ(Mesh::parse("a=65536,b=32767").world_size(), 65536 * 32767);
}

TEST(Mesh, WorldSizeMismatchNamesBoth) {
  Mesh m = Mesh::parse("dp=2,tp=4");
  try {
    m.require_world(16);
    FAIL() << "no error";
  } catch (const dc::InputError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("dp=2,tp=4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("16"), std::string::npos) << msg;
  }
}
