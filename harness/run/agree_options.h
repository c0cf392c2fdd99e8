// Rank 0's options for every rank of a run (run.h's RunOptions): one
// broadcast, so ranks started with other arguments or another environment
// agree instead of validating differently and hanging.
#pragma once
#include "harness/core/comm.h"
#include "harness/run/run.h"

namespace dc {

RunOptions agree_on_options(const Comm& world, RunOptions opts);

}  // namespace dc
