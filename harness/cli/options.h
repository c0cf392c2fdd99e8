// The command line's shared pieces: what the launcher says about this
// process (before MPI starts), sizes, and the option groups several
// subcommands take (reports, pipelines, flag-trial targets).
#pragma once
#include <CLI/CLI.hpp>

#include <string>

#include "harness/report/compare_command.h"
#include "harness/core/pipeline_options.h"
#include "harness/search/flag_search.h"

namespace dc::cli {

// The launcher's rank and world size, known before MPI_Init (only rank 0
// prints usage errors).
int launcher_rank();
int launcher_size();
// Cores per process of this host (OpenMPI says how many share it).
int threads_per_process();
// "128", "128M", "512MiB", "2G": a size in bytes; a bare number means MiB.
std::size_t parse_size(const std::string& text, const std::string& option = "--memory-budget");

// --json/--html/--junit, --atol/--rtol, --tolerances, memory and threads.
// `tolerances_file` receives --tolerances FILE.
void add_report_options(CLI::App& app, ReportOptions& r, std::string& tolerances_file);
// --steps, --reference-mode and --tap-blocks, for pipeline scenarios.
void add_pipeline_options(CLI::App& app, PipelineOptions& p);
// What one flag trial runs (bisect, sweep): a scenario or the user's command.
void add_target_options(CLI::App& app, FlagTarget& t, std::string& flags_csv);

}  // namespace dc::cli
