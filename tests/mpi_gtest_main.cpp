// gtest main for tests that run under mpirun: every rank runs every test, only
// rank 0 prints, and the verdict is reduced so every rank exits the same way.
// Tests that use collectives must not return early on one rank (EXPECT, not
// ASSERT, around collectives), or the other ranks would wait forever.
#include <gtest/gtest.h>
#include <mpi.h>

#include "harness/core/log.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ::testing::InitGoogleTest(&argc, argv);
  dc::setup_logging(rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any_failed && !failed) std::fprintf(stderr, "a test failed on another rank\n");
  MPI_Finalize();
  return any_failed;
}
