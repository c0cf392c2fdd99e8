// The launch floor: a bare MPI program doing what any N-rank job must (start,
// 50 small all-to-alls, finish). The yardstick `diffcheck --scenario` is timed
// against (scripts/bench/bench_launch_floor.py). Bare MPI on purpose: it measures
// mpirun and MPI_Init, not diffcheck.
#include <mpi.h>

#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  std::vector<float> send(static_cast<std::size_t>(n) * 64, 1.0f), recv(send.size());
  for (int i = 0; i < 50; ++i)
    MPI_Alltoall(send.data(), 64, MPI_FLOAT, recv.data(), 64, MPI_FLOAT, MPI_COMM_WORLD);
  MPI_Finalize();
  return 0;
}
