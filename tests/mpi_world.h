// The world communicator of the MPI tests, made once per process (after
// MPI_Init in mpi_gtest_main.cpp) and shared by every test file.
#pragma once
#include "harness/core/comm.h"

inline dc::Comm& world() {
  static dc::Comm w = dc::Comm::world();
  return w;
}
