// The raw MPI communicator behind a Comm, for the one other module that must
// hand it to a library (store: parallel HDF5's MPI-IO driver). Nothing else
// includes this header.
#pragma once
#include <mpi.h>

#include "harness/core/comm.h"

namespace dc {
struct CommAccess {
  static MPI_Comm native(const Comm& c);
};
}  // namespace dc
