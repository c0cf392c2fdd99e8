// What a stopped rank leaves: nothing it was writing, one STOPPED line from
// the reporting rank (none once the verdict is out), status 128 + signal.
// Each case forks a "rank" that registers its files and is then signalled.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "harness/core/interrupt.h"
#include "harness/core/mpi_settings.h"

namespace dc {
namespace {

namespace fs = std::filesystem;

struct Stopped {
  int status = -1;
  std::string err;
};

// Forks; the child runs `setup` then raises `sig`; returns its exit status and stderr.
template <class F>
Stopped stop_child(int sig, F setup) {
  int pipefd[2];
  EXPECT_EQ(pipe(pipefd), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], 2);
    close(pipefd[0]);
    setup();
    raise(sig);
    _exit(99);  // not reached: the handler exits
  }
  close(pipefd[1]);
  Stopped s;
  char buf[4096];
  for (ssize_t n; (n = read(pipefd[0], buf, sizeof buf)) > 0;) s.err.append(buf, static_cast<std::size_t>(n));
  close(pipefd[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  s.status = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
  return s;
}

std::string fresh(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("diffcheck_interrupt_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void touch(const std::string& path) { std::ofstream(path) << "x"; }

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(Interrupt, AStoppedRankRemovesWhatTheRunWasWritingAndSaysWhereItWas) {
  const std::string dir = fresh("stop");
  const std::string tmp = dir + "/run.h5.tmp", watch = dir + "/run.h5.watch";
  const auto s = stop_child(SIGTERM, [&] {
    interrupt::install(0, true, false);
    interrupt::set_phase("writing the run file");
    interrupt::remove_when_stopped(tmp);
    interrupt::remove_directory_when_stopped(watch);
    touch(tmp);
    fs::create_directories(watch);
    for (const char* f : {"rank0", "rank1.tmp", "rank7", "hang.reported"}) touch(watch + "/" + f);  // rank 7 was killed
  });
  EXPECT_EQ(s.status, 143);
  EXPECT_EQ(count(s.err, "STOPPED by the launcher (SIGTERM) while writing the run file"), 1) << s.err;
  EXPECT_NE(s.err.find("partial files removed, exit 143; last collective none yet; last tap none yet"),
            std::string::npos) << s.err;
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_FALSE(fs::exists(watch));
  fs::remove_all(dir);
}

// The hang reporter clears the records but keeps the claim: the ranks still
// running must not claim and report the same hang again.
TEST(Interrupt, TheHangReportersCleanUpKeepsTheClaim) {
  const std::string dir = fresh("claim");
  const std::string watch = dir + "/run.h5.watch";
  fs::create_directories(watch);
  for (const char* f : {"rank0", "rank1", "rank1.tmp", "hang.reported"}) touch(watch + "/" + f);
  const pid_t pid = fork();
  if (pid == 0) {
    interrupt::remove_directory_when_stopped(watch);
    interrupt::remove_partial_files(false);
    _exit(0);
  }
  waitpid(pid, nullptr, 0);
  EXPECT_TRUE(fs::exists(watch + "/hang.reported"));
  EXPECT_FALSE(fs::exists(watch + "/rank0"));
  EXPECT_FALSE(fs::exists(watch + "/rank1"));
  EXPECT_FALSE(fs::exists(watch + "/rank1.tmp"));
  fs::remove_all(dir);
}

TEST(Interrupt, CtrlCExits130AndOnlyTheReporterSpeaks) {
  const auto reporter = stop_child(SIGINT, [] { interrupt::install(0, true, false); });
  EXPECT_EQ(reporter.status, 130);
  EXPECT_EQ(count(reporter.err, "STOPPED by SIGINT (Ctrl-C) while starting (MPI start-up)"), 1) << reporter.err;
  const auto other = stop_child(SIGINT, [] { interrupt::install(3, false, false); });
  EXPECT_EQ(other.status, 130);
  EXPECT_EQ(other.err, "");
}

TEST(Interrupt, AfterTheVerdictNoLineButTheFilesStillGo) {
  const std::string dir = fresh("verdict");
  const std::string tmp = dir + "/report.json.tmp";
  const auto s = stop_child(SIGTERM, [&] {
    interrupt::install(0, true, false);
    interrupt::remove_when_stopped(tmp);
    touch(tmp);
    interrupt::verdict_reached();
  });
  EXPECT_EQ(s.status, 143);
  EXPECT_EQ(s.err, "");
  EXPECT_FALSE(fs::exists(tmp));
  fs::remove_all(dir);
}

TEST(Interrupt, AFileNoLongerBeingWrittenIsKept) {
  const std::string dir = fresh("kept");
  const std::string report = dir + "/report.json";
  const auto s = stop_child(SIGTERM, [&] {
    interrupt::install(0, false, false);
    { const interrupt::Removal while_written(report); }
    touch(report);  // renamed into place: whole, the user's now
  });
  EXPECT_EQ(s.status, 143);
  EXPECT_TRUE(fs::exists(report));
  fs::remove_all(dir);
}

TEST(MpiSettings, SharedMemoryGoesToTheSessionDirectoryUnlessTheUserChose) {
  const std::string home = fresh("home");
  setenv("HOME", home.c_str(), 1);
  unsetenv("OMPI_MCA_btl_vader_backing_directory");
  setenv("OMPI_MCA_orte_jobfam_session_dir", "/tmp/ompi.x.0/pid.1", 1);
  keep_shared_memory_in_session_directory();
  ASSERT_NE(std::getenv("OMPI_MCA_btl_vader_backing_directory"), nullptr);
  EXPECT_STREQ(std::getenv("OMPI_MCA_btl_vader_backing_directory"), "/tmp/ompi.x.0/pid.1");

  setenv("OMPI_MCA_btl_vader_backing_directory", "/mine", 1);  // the environment or mpirun --mca
  keep_shared_memory_in_session_directory();
  EXPECT_STREQ(std::getenv("OMPI_MCA_btl_vader_backing_directory"), "/mine");

  unsetenv("OMPI_MCA_btl_vader_backing_directory");
  fs::create_directories(home + "/.openmpi");
  std::ofstream(home + "/.openmpi/mca-params.conf") << "# mine\n  btl_vader_backing_directory = /mine\n";
  keep_shared_memory_in_session_directory();
  EXPECT_EQ(std::getenv("OMPI_MCA_btl_vader_backing_directory"), nullptr);

  unsetenv("OMPI_MCA_orte_jobfam_session_dir");  // not under mpirun: nothing to choose
  fs::remove_all(home);
  keep_shared_memory_in_session_directory();
  EXPECT_EQ(std::getenv("OMPI_MCA_btl_vader_backing_directory"), nullptr);
}

TEST(MpiSettings, Ob1AndNoPciDiscoveryOnOneHostUnlessTheUserChoseOrTheJobSpansHosts) {
  const std::string home = fresh("home_pml");
  setenv("HOME", home.c_str(), 1);
  const char* launcher_vars[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_RANK", "PMI_RANK",
                                 "PMI_SIZE", "SLURM_STEP_ID", "SLURM_PROCID", "OMPI_MCA_pml", "HWLOC_COMPONENTS"};
  auto chosen = [&](std::vector<std::pair<const char*, const char*>> env) {
    for (const char* v : launcher_vars) unsetenv(v);
    for (auto [k, v] : env) setenv(k, v, 1);
    lighten_start_up_on_one_host();
    const char* pml = std::getenv("OMPI_MCA_pml");
    return std::string(pml ? pml : "(none)");
  };
  EXPECT_EQ(chosen({{"OMPI_COMM_WORLD_SIZE", "16"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "16"}}), "ob1");
  EXPECT_STREQ(std::getenv("HWLOC_COMPONENTS"), "-pci,-linuxio");
  EXPECT_EQ(chosen({}), "ob1");  // a singleton
  EXPECT_EQ(chosen({{"OMPI_COMM_WORLD_SIZE", "16"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "8"}}), "(none)");  // two hosts
  EXPECT_EQ(std::getenv("HWLOC_COMPONENTS"), nullptr);
  EXPECT_EQ(chosen({{"HWLOC_COMPONENTS", "-mine"}}), "ob1");
  EXPECT_STREQ(std::getenv("HWLOC_COMPONENTS"), "-mine");
  EXPECT_EQ(chosen({{"OMPI_COMM_WORLD_SIZE", "16"}}), "(none)");
  EXPECT_EQ(chosen({{"SLURM_PROCID", "3"}}), "(none)");  // srun: hosts unknown
  EXPECT_EQ(chosen({{"PMIX_RANK", "0"}}), "(none)");
  EXPECT_EQ(chosen({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}, {"OMPI_MCA_pml", "ucx"}}),
            "ucx");  // the environment or mpirun --mca
  fs::create_directories(home + "/.openmpi");
  std::ofstream(home + "/.openmpi/mca-params.conf") << "pml_ucx_verbose = 1\npml = ^ucx,cm\n";
  EXPECT_EQ(chosen({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}), "ob1");  // excludes only
  std::ofstream(home + "/.openmpi/mca-params.conf") << "pml = ^ob1\n";
  EXPECT_EQ(chosen({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}), "(none)");
  std::ofstream(home + "/.openmpi/mca-params.conf") << "  pml=ucx\n";
  EXPECT_EQ(chosen({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}), "(none)");
  for (const char* v : launcher_vars) unsetenv(v);
  fs::remove_all(home);
}

}  // namespace
}  // namespace dc
