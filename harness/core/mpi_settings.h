// OpenMPI settings diffcheck chooses for its own processes before MPI_Init,
// each only where the user has not chosen (environment, mpirun --mca, the
// system's or the user's parameter file).
#pragma once

namespace dc {

// vader's shared-memory segments in the job's session directory (removed by
// mpirun at every end of a job) instead of /dev/shm (left there when a job is
// interrupted or crashes). Called by Comm::init.
void keep_shared_memory_in_session_directory();

}  // namespace dc
