// How a scenario trial is started: a launcher template such as
// "mpirun --host h1:8,h2:8 -n {n}" or "srun -N 2 -n {n}", split into words
// like a shell would (quotes, backslashes; no expansion), {n} replaced by the
// rank count, the diffcheck command appended. Default: "<mpirun> -n {n}".
#pragma once
#include <string>
#include <vector>

namespace dc {

// Throws InputError for an empty template or an unterminated quote.
std::vector<std::string> launcher_argv(const std::string& launcher, const std::string& mpirun, int ranks);

// A fresh scratch directory for a search's trial files (run files, reports)
// under `work_dir` (default: the system's temporary directory). A trial's
// rank 0 writes its report there and this process reads it back, so across
// hosts it must be a directory both see when rank 0 runs on another host.
std::string scratch_directory(const std::string& work_dir, const std::string& stem);

// The words for a trial whose rank 0 wrote no report where this process looks.
std::string missing_report_hint(const std::string& report);

}  // namespace dc
