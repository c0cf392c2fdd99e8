// Child-process trials: exit codes, crashes and hangs are outcomes.
#include <gtest/gtest.h>

#include "harness/search/sweep_mesh.h"
#include "harness/search/trial.h"

using dc::TrialOutcome;

TEST(Trial, ExitCodeAndOutput) {
  auto t = dc::run_trial({{"sh", "-c", "echo hello; echo oops >&2; exit 3"}, {}, 30});
  EXPECT_EQ(t.kind, TrialOutcome::Kind::exited);
  EXPECT_EQ(t.exit_code, 3);
  EXPECT_NE(t.output.find("hello"), std::string::npos);
  EXPECT_NE(t.output.find("oops"), std::string::npos);
}

TEST(Trial, EnvironmentIsPassed) {
  auto t = dc::run_trial({{"sh", "-c", "test \"$XLA_FLAGS\" = --a=1"}, {{"XLA_FLAGS", "--a=1"}}, 30});
  EXPECT_EQ(t.exit_code, 0) << t.output;
}

TEST(Trial, CrashIsRecorded) {
  auto t = dc::run_trial({{"sh", "-c", "kill -SEGV $$"}, {}, 30});
  EXPECT_EQ(t.kind, TrialOutcome::Kind::crashed);
  EXPECT_EQ(t.signal, SIGSEGV);
}

TEST(Trial, HangIsKilledAtTheLimitWithItsChildren) {
  auto t = dc::run_trial({{"sh", "-c", "sleep 60 & sleep 60; wait"}, {}, 0.5});
  EXPECT_EQ(t.kind, TrialOutcome::Kind::timed_out);
  EXPECT_LT(t.seconds, 10.0);
}

TEST(Trial, MissingProgramIsExit127) {
  auto t = dc::run_trial({{"/nonexistent/program"}, {}, 30});
  EXPECT_EQ(t.exit_code, 127);
}

TEST(SweepMesh, Factorizations) {
  auto f = dc::mesh_factorizations(16, 4);
  EXPECT_EQ(f.size(), 35u);
  for (const auto& s : f) EXPECT_EQ(s[0] * s[1] * s[2] * s[3], 16);
  EXPECT_EQ(dc::mesh_factorizations(6, 2).size(), 4u);  // 1x6 2x3 3x2 6x1
  EXPECT_EQ(dc::mesh_factorizations(1, 3), (std::vector<std::vector<int>>{{1, 1, 1}}));
}
