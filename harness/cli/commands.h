// The subcommands of diffcheck: each holds its options, adds them to the
// command line (`add`) and does its work once parsed (`execute`). main.cpp
// only builds the command line and hands over to the one that was named.
#pragma once
#include <CLI/CLI.hpp>

#include <string>

#include "harness/report/compare_command.h"
#include "harness/run/calibrate.h"
#include "harness/run/run.h"
#include "harness/search/flag_search.h"
#include "harness/search/sweep_mesh.h"

namespace dc::cli {

// The default command: run a scenario on every rank of the job.
struct RunCommand {
  RunOptions run;
  void add(CLI::App& app);
  int execute(int* argc, char*** argv, int rank0);
};

// `compare`: check activation files on disk; under mpirun the processes share the work.
struct CompareCommand {
  CLI::App* sub = nullptr;
  std::string source, reference;
  std::vector<std::string> against;  // run against run: the other run(s)
  bool exact = false;
  ReportOptions report;
  void add(CLI::App& app);
  int execute(int* argc, char*** argv);
  int check() const;
};

// `calibrate`: measure each tap's noise floor and write a tolerance file.
struct CalibrateCommand {
  CLI::App* sub = nullptr;
  CalibrateOptions options;
  int ranks = 1;
  std::string mpirun = "mpirun";
  void add(CLI::App& app);
  int execute(int* argc, char*** argv);
};

// `sweep-mesh`: a scenario on every mesh N ranks can form.
struct SweepMeshCommand {
  CLI::App* sub = nullptr;
  SweepMeshOptions options;
  void add(CLI::App& app);
  int execute();
  std::string axes_csv;  // --axes, a command's
  int sweep_command();   // a command instead of a scenario
};

// `bisect` and `sweep`: flag trials (a scenario or the user's command).
struct BisectCommand {
  CLI::App* sub = nullptr;
  BisectOptions options;
  std::string flags_csv, baseline_csv, fail_on;
  void add(CLI::App& app);
  int execute();
};

struct SweepCommand {
  CLI::App* sub = nullptr;
  SweepOptions options;
  std::string flags_csv, profiles_file;
  bool all_subsets = false;
  void add(CLI::App& app);
  int execute();
};

}  // namespace dc::cli
