// The hang report is printed once per run: ranks that see each other's
// progress records at different moments can each think they are the lowest
// stuck rank (seen in CI: two "HANG: no progress" reports from one hang at 16
// ranks); the claim file decides which of them speaks.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#include "harness/core/interrupt.h"
#include "harness/core/progress.h"
#include "harness/core/watchdog.h"

namespace dc {
namespace {

std::string fresh_directory(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("diffcheck_watchdog_" + name);
  std::filesystem::remove_all(dir);
  return dir.string();
}

// A "rank": a child process whose stderr goes to LOGS/stderrR, running `body`.
template <class F>
pid_t fork_rank(const std::string& logs, int r, F body) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int err = ::open((logs + "/stderr" + std::to_string(r)).c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    dup2(err, 2);
    body();
    _exit(0);
  }
  return pid;
}

std::string stderr_of(const std::string& logs, int r) {
  std::ifstream in(logs + "/stderr" + std::to_string(r));
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A watch directory and, beside it, the ranks' logs; both removed at the end.
struct Scratch {
  explicit Scratch(const std::string& name) : dir(fresh_directory(name)), logs(fresh_directory(name + "_logs")) {
    prepare_watch_directory(dir);
    std::filesystem::create_directories(logs);
  }
  ~Scratch() {
    std::filesystem::remove_all(dir);
    std::filesystem::remove_all(logs);
  }
  std::string dir, logs;
};

// Two "ranks", each with its watchdog (a time limit of 1 s): `busy` records
// progress for `busy_ms`, the other none; both then wait for their watchdog
// to end them. After `wait_ms` both are killed, as the launcher does once one
// rank has reported. Each registers the watch directory for removal as a run
// does.
void stall_two_ranks(const Scratch& at, int busy, int busy_ms, int wait_ms) {
  std::vector<pid_t> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(fork_rank(at.logs, r, [&] {
      interrupt::remove_directory_when_stopped(at.dir);
      progress::recorded_tap("start");
      Watchdog watchdog(at.dir, r, 2, 1.0);
      const auto t0 = std::chrono::steady_clock::now();
      while (r == busy && std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(busy_ms)) {
        progress::recorded_tap("busy");
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms + 3000));  // the watchdog ends it
    }));
    ASSERT_GE(ranks.back(), 0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
  for (pid_t pid : ranks) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
}

TEST(HangReport, OnlyOneOfManyRacingRanksClaimsIt) {
  const std::string dir = fresh_directory("race");
  prepare_watch_directory(dir);
  std::atomic<int> claimed{0};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 16; ++r)
    ranks.emplace_back([&] {
      if (claim_hang_report(dir)) ++claimed;
    });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(claimed.load(), 1);
  EXPECT_FALSE(claim_hang_report(dir));
  std::filesystem::remove_all(dir);
}

TEST(HangReport, ANewRunClearsTheClaimAndRecordsOfAnEndedOne) {
  const std::string dir = fresh_directory("rerun");
  prepare_watch_directory(dir);
  ASSERT_TRUE(claim_hang_report(dir));
  std::ofstream(dir + "/rank3") << "57\tall_to_all\tsp\tattn/q\t1.0\n";  // a rank ended mid-run
  prepare_watch_directory(dir);
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  EXPECT_TRUE(claim_hang_report(dir));
  std::filesystem::remove_all(dir);
}

// One process per rank, each with its watchdog (a time limit of 1 s). Rank 1
// stops at once; rank 0 keeps making progress for 1.2 s, then stops too. Rank
// 1's time runs out while rank 0 still looks alive, so rank 1 is the lowest
// stuck rank it sees; when rank 0's runs out, rank 1 looks stuck but rank 0 is
// lower. Without the claim both print a report. Each registers the watch
// directory for removal as a run does: the reporter's clean-up must keep the
// claim (it once swept it away with the records, and a second rank reported
// the same hang: CI, 16 ranks).
TEST(HangReport, RanksThatStallAtDifferentMomentsPrintOneReport) {
  const Scratch at("stagger");
  stall_two_ranks(at, 0, 1200, 5000);  // both time limits long past
  int reports = 0;
  for (int r = 0; r < 2; ++r) {
    const std::string err = stderr_of(at.logs, r);
    for (auto i = err.find("HANG: no progress"); i != std::string::npos; i = err.find("HANG: no progress", i + 1))
      ++reports;
  }
  EXPECT_EQ(reports, 1);
}

// Another rank has reported the hang; the launcher now stops this one, whose
// handler waits half a second before it exits (interrupt.h: so that the
// launcher does not kill the others before their handlers ran). Its watchdog
// thread runs on meanwhile: it must not take that moment, with the claim
// removed by the handler, to report the same hang again (seen in CI: two
// reports of one hang at 16 ranks).
TEST(HangReport, ARankBeingStoppedDoesNotReportAgain) {
  const Scratch at("stopping");
  ASSERT_TRUE(claim_hang_report(at.dir));  // rank 1 reported
  const pid_t pid = fork_rank(at.logs, 0, [&] {
    interrupt::install(0, false, true);
    interrupt::remove_directory_when_stopped(at.dir);
    progress::recorded_tap("start");
    Watchdog watchdog(at.dir, 0, 2, 1.0);
    std::this_thread::sleep_for(std::chrono::milliseconds(1700));  // past the limit: silent, the claim is taken
    raise(SIGTERM);  // on this thread: the watchdog's runs on through the handler's half second
    _exit(99);
  });
  ASSERT_GE(pid, 0);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 143) << status;
  const std::string err = stderr_of(at.logs, 0);
  EXPECT_EQ(err.find("HANG"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(at.dir)) << "the stop leaves nothing";
}

// Two ranks past their time limit after a third reported; the launcher's
// SIGTERM reaches one 0.45 s before the other (a loaded machine). While the
// first waits in its handler, the claim must still be there for the second's
// watchdog.
TEST(HangReport, TheClaimOutlastsTheWaitOfAStoppedRank) {
  const Scratch at("stopping2");
  ASSERT_TRUE(claim_hang_report(at.dir));  // rank 2 reported
  std::vector<pid_t> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(fork_rank(at.logs, r, [&] {
      interrupt::install(r, false, true);
      interrupt::remove_directory_when_stopped(at.dir);
      progress::recorded_tap("start");
      Watchdog watchdog(at.dir, r, 3, 1.0);
      std::this_thread::sleep_for(std::chrono::seconds(30));  // the launcher ends it
      _exit(99);
    }));
    ASSERT_GE(ranks.back(), 0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1700));  // both past the limit, silent
  kill(ranks[1], SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(450));
  kill(ranks[0], SIGTERM);
  for (int r = 0; r < 2; ++r) {
    int status = 0;
    waitpid(ranks[static_cast<std::size_t>(r)], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 143) << "rank " << r << ": " << status;
    const std::string err = stderr_of(at.logs, r);
    EXPECT_EQ(err.find("HANG"), std::string::npos) << "rank " << r << ": " << err;
  }
  EXPECT_FALSE(std::filesystem::exists(at.dir)) << "the stop leaves nothing";
}

TEST(HangReport, AClaimThatCannotBeWrittenStillReports) {
  EXPECT_TRUE(claim_hang_report("/nonexistent/diffcheck/watch"));
}

// The hang's length is the time since the last progress of any rank. Rank 0
// stops at once; rank 1 works on for 2.5 s, then stops too (a time limit of
// 1 s). Rank 0, the lowest, reports once both are stuck: about 1 s after
// rank 1's last progress, while its own stall is 3.5 s. It once printed its
// own (e2e_flux_pipeline under load: "no progress for 30 s (--timeout 5)").
TEST(HangReport, TheHangIsTimedFromTheLastProgressOfAnyRank) {
  const Scratch at("since_any");
  stall_two_ranks(at, 1, 2500, 5500);
  const std::string err = stderr_of(at.logs, 0) + stderr_of(at.logs, 1);
  const auto at_report = err.find("HANG: no progress for ");
  ASSERT_NE(at_report, std::string::npos) << err;
  const int seconds = std::stoi(err.substr(at_report + 22));
  EXPECT_GE(seconds, 1) << err;
  EXPECT_LE(seconds, 2) << err;  // not rank 0's own 3-4 s
}

}  // namespace
}  // namespace dc
