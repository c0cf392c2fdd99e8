// spdlog set-up: every line carries the MPI rank, so interleaved output from
// many ranks can be told apart. Logs go to stderr; reports go to stdout.
#pragma once
#include <string>

namespace dc {
// rank < 0: not running under MPI (compare, list). Level from DIFFCHECK_LOG
// (trace, debug, info, warn, error; default warn for quiet runs).
void setup_logging(int rank);
}  // namespace dc
