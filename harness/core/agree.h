// Ending alike on every process. A step that can fail on some processes and
// not others (reading a file, checking a share of it) must not leave one
// process throwing while the others wait in the next collective: each
// process's outcome travels as text — its result, or its error with its kind
// (an InputError stays one: exit 2) — and every process then throws the same
// error or goes on with the results.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "harness/core/comm.h"

namespace dc {

// Runs `work` on `root` alone; every process returns its result, or throws
// the error it threw (an InputError stays one; over the world communicator
// any other error is an AgreedError: the job may end cleanly). Collective
// over `c`.
std::string agreed_on_root(const Comm& c, int root, const std::function<std::string()>& work);

// Runs `work` on every process; returns every process's result (by rank), or,
// when any threw, throws the lowest rank's error on every process.
// Collective over `c`.
std::vector<std::string> agreed_on_all(const Comm& c, const std::function<std::string()>& work);

}  // namespace dc
