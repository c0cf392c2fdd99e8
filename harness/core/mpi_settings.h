// OpenMPI settings diffcheck chooses for its own processes before MPI_Init,
// each only where the user has not chosen (environment, mpirun --mca, the
// system's or the user's parameter file).
#pragma once

namespace dc {

// vader's shared-memory segments in the job's session directory (removed by
// mpirun at every end of a job) instead of /dev/shm (left there when a job is
// interrupted or crashes). Called by Comm::init.
void keep_shared_memory_in_session_directory();

// OpenMPI's point-to-point layer ob1 (shared memory through vader) for a job
// whose processes are all on this host, instead of letting MPI_Init probe
// UCX, which on one host brings nothing and costs start-up time: a 16-rank
// flux_tp run on 2 cores took 0.84 s instead of 1.1 s, a single process
// 0.13 s instead of 0.35 s. The host test: mpirun's OMPI_COMM_WORLD_LOCAL_SIZE
// equal to its OMPI_COMM_WORLD_SIZE, or no launcher at all (a singleton).
// Under another launcher (srun, PMIx without mpirun's variables) nothing is
// chosen. Also hwloc's PCI discovery is left out there (HWLOC_COMPONENTS,
// unless set). Called by Comm::init.
void lighten_start_up_on_one_host();

}  // namespace dc
