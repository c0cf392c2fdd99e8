// Checked collectives at whatever rank count ctest launches (1, 2, 4, ...).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <numeric>
#include <stdexcept>

#include "harness/core/agree.h"
#include "harness/core/comm.h"
#include "harness/core/error.h"
#include "tests/mpi_world.h"

using namespace dc;

TEST(Comm, BroadcastAndAsyncBroadcast) {
  std::vector<float> v(5, world().rank() == 0 ? 3.5f : 0.f);
  world().broadcast(std::span<float>(v), 0);
  EXPECT_EQ(v, std::vector<float>(5, 3.5f));
  std::vector<double> d(3, world().rank() == 0 ? -1.0 : 0.0);
  Request r = world().ibroadcast(std::span<double>(d), 0);
  r.wait();
  EXPECT_EQ(d, std::vector<double>(3, -1.0));
}

TEST(Comm, AllReduceIsExactAndBitwiseIdenticalEverywhere) {
  const int n = world().size();
  // Values whose float sum depends on the order: identical bits on every rank
  // is what replica checks rely on.
  std::vector<float> v(7);
  for (int i = 0; i < 7; ++i) v[i] = 1.0f / (world().rank() + 1 + i) * (i % 2 ? 1e7f : 1.0f);
  std::vector<float> mine = v;
  world().all_reduce_sum(std::span<float>(v));
  auto all = world().all_gather(std::span<const float>(v));
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < 7; ++i) EXPECT_EQ(all[r * 7 + i], v[i]);
  // And equals the rank-ordered double sum of everyone's input.
  auto inputs = world().all_gather(std::span<const float>(mine));
  for (int i = 0; i < 7; ++i) {
    double acc = 0;
    for (int r = 0; r < n; ++r) acc += inputs[r * 7 + i];
    EXPECT_EQ(v[i], static_cast<float>(acc));
  }
  std::vector<float> w(3, 1.0f);
  Request req = world().iall_reduce_sum(std::span<float>(w));
  req.wait();
  EXPECT_EQ(w, std::vector<float>(3, static_cast<float>(n)));
}

TEST(Comm, ReduceScatterAndAllToAll) {
  const int n = world().size(), me = world().rank();
  std::vector<double> buf(2 * n);
  for (int i = 0; i < 2 * n; ++i) buf[i] = i + 100 * me;
  auto mine = world().reduce_scatter_sum(std::span<const double>(buf));
  ASSERT_EQ(mine.size(), 2u);
  double ranks_sum = 100.0 * n * (n - 1) / 2;
  EXPECT_EQ(mine[0], n * (2.0 * me) + ranks_sum);
  EXPECT_EQ(mine[1], n * (2.0 * me + 1) + ranks_sum);

  std::vector<float> send(n), recv(n);
  for (int j = 0; j < n; ++j) send[j] = static_cast<float>(10 * me + j);  // block j for rank j
  world().all_to_all(std::span<const float>(send), std::span<float>(recv));
  for (int j = 0; j < n; ++j) EXPECT_EQ(recv[j], 10 * j + me);
}

TEST(Comm, SplitFollowsTheMesh) {
  const int n = world().size();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even rank count";
  Mesh m = Mesh::parse(fmt::format("dp={},tp=2", n / 2));
  Comm tp = world().split(m, {"tp"});
  Comm dp = world().split(m, {"dp"});
  EXPECT_EQ(tp.size(), 2);
  EXPECT_EQ(dp.size(), n / 2);
  EXPECT_EQ(tp.rank(), m.coords(world().rank())[1]);
  std::vector<double> v{static_cast<double>(world().rank())};
  tp.all_reduce_sum(std::span<double>(v));
  int base = world().rank() - world().rank() % 2;
  EXPECT_EQ(v[0], 2.0 * base + 1);
}

TEST(Comm, MismatchedCollectiveIsAnErrorNotAHang) {
  if (world().size() < 2) GTEST_SKIP() << "needs two ranks";
  // Rank 0 broadcasts 4 elements while the others expect 5.
  std::vector<float> v(world().rank() == 0 ? 4 : 5, 0.f);
  EXPECT_THROW(world().broadcast(std::span<float>(v), 0), Error);
}

TEST(Agree, RootsResultOrItsErrorOnEveryRank) {
  const Comm& c = world();
  const int root = c.size() - 1;
  EXPECT_EQ(agreed_on_root(c, root, [&] { return fmt::format("from {}", c.rank()); }),
            fmt::format("from {}", root));
  // The root's input error is an input error everywhere, with its message.
  try {
    agreed_on_root(c, root, []() -> std::string { throw InputError("bad file"); });
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "bad file");
  }
  // Any other error stays an Error (not an input error) everywhere.
  try {
    agreed_on_root(c, root, []() -> std::string { throw std::runtime_error("broken"); });
    ADD_FAILURE() << "no error";
  } catch (const InputError&) {
    ADD_FAILURE() << "became an input error";
  } catch (const AgreedError& e) {
    // Over the world every process has it: the job may end cleanly (main).
    EXPECT_STREQ(e.what(), "broken");
  } catch (const Error& e) {
    ADD_FAILURE() << "over the world, an AgreedError expected: " << e.what();
  }
  // Over a part of the job, a plain Error: the rest of the job did not raise it.
  if (c.size() % 2 == 0) {
    const Comm part = c.split(Mesh::parse(fmt::format("dp=2,tp={}", c.size() / 2)), {"tp"});
    try {
      agreed_on_root(part, 0, []() -> std::string { throw std::runtime_error("half broken"); });
      ADD_FAILURE() << "no error";
    } catch (const AgreedError&) {
      ADD_FAILURE() << "an error of half the job is no AgreedError";
    } catch (const Error& e) {
      EXPECT_STREQ(e.what(), "half broken");
    }
  }
}

TEST(Agree, EveryRanksResultsOrTheLowestRanksErrorEverywhere) {
  const Comm& c = world();
  const auto all = agreed_on_all(c, [&] { return std::to_string(c.rank() * 10); });
  ASSERT_EQ(all.size(), static_cast<std::size_t>(c.size()));
  for (int r = 0; r < c.size(); ++r) EXPECT_EQ(all[static_cast<std::size_t>(r)], std::to_string(r * 10));
  // The upper half fails, each its own way; every rank throws the lowest
  // failing rank's error, and none waits for another.
  const int first_bad = c.size() / 2;
  try {
    agreed_on_all(c, [&]() -> std::string {
      if (c.rank() < first_bad) return "fine";
      if (c.rank() == first_bad) throw InputError(fmt::format("rank {} cannot read", c.rank()));
      throw Error(fmt::format("rank {} broke", c.rank()));
    });
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), fmt::format("rank {} cannot read", first_bad));
  }
}
