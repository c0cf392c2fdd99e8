// The pieces of a scenario run (run.cpp) that settle what it will do before
// it runs: each decided identically on every rank (or agreed on), so a bad
// option ends every rank with the same InputError and no rank hangs.
#pragma once
#include <chrono>
#include <string>

#include "harness/check/noise_floor.h"
#include "harness/core/comm.h"
#include "harness/core/dtype.h"
#include "harness/core/flags.h"
#include "harness/core/mesh.h"
#include "harness/run/run.h"
#include "harness/run/scenario.h"

namespace dc {

// The scenario of that name, or an InputError listing the known ones.
const Scenario& lookup_scenario(const std::string& name);
// An InputError unless `fault` is one of the scenario's (or empty) and
// `scale` fits it.
void check_fault(const Scenario& s, const std::string& fault, double scale);
// The last collective and tap this rank was in, for a crash's message.
std::string where_now();
// Which ranks run on which host, for the line rank 0 prints when the launcher
// ends the job (a lost host): one hostname per rank, gathered once. True
// when every rank runs on one host.
bool announce_hosts(const Comm& world);
// The table of --tolerances FILE: rank 0 reads the file and every rank parses
// the same text, so all agree on it (or on the error) whatever hosts see.
ToleranceTable tolerance_file_table(const Comm& world, const RunOptions& opts, const Scenario& scenario,
                                    const FlagValues& flags);
double seconds_since(std::chrono::steady_clock::time_point t0);
// Everything a run's references depend on, for the reference cache's key.
std::string reference_key(const Scenario& s, const RunOptions& o, const Mesh& mesh, const FlagValues& flags,
                          DType dtype);

}  // namespace dc
