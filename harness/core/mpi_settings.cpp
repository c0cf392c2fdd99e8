#include "harness/core/mpi_settings.h"

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace dc {
namespace {

// Whether an OpenMPI parameter file (the system's or the user's) sets `name`.
bool set_in_parameter_file(const std::string& name) {
  std::vector<std::string> files = {"/etc/openmpi/openmpi-mca-params.conf"};
  if (const char* home = std::getenv("HOME")) files.push_back(std::string(home) + "/.openmpi/mca-params.conf");
  for (const auto& path : files) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const auto at = line.find_first_not_of(" \t");
      if (at != std::string::npos && line[at] != '#' && line.compare(at, name.size(), name) == 0) return true;
    }
  }
  return false;
}

}  // namespace

// OpenMPI's shared-memory BTL (vader) backs each rank's segment with a file
// in /dev/shm, removed when the job ends well; a job ended by Ctrl-C, a
// crash or a time-out can leave them there, memory no one frees. In the job's
// session directory, which mpirun removes at every end of a job (an aborted
// one too), they go with the job. The user's own choice (environment,
// mpirun --mca, parameter file) stands.
void keep_shared_memory_in_session_directory() {
  const char* param = "btl_vader_backing_directory";
  const char* session = std::getenv("OMPI_MCA_orte_jobfam_session_dir");
  if (!session || std::getenv("OMPI_MCA_btl_vader_backing_directory") || set_in_parameter_file(param)) return;
  setenv("OMPI_MCA_btl_vader_backing_directory", session, 0);
}

}  // namespace dc
