#include "harness/core/mpi_settings.h"

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace dc {
namespace {

// The values an OpenMPI parameter file (the system's, then the user's) gives
// `name` ("name = value" lines; '#' starts a comment).
std::vector<std::string> parameter_file_values(const std::string& name) {
  std::vector<std::string> files = {"/etc/openmpi/openmpi-mca-params.conf"};
  if (const char* home = std::getenv("HOME")) files.push_back(std::string(home) + "/.openmpi/mca-params.conf");
  std::vector<std::string> values;
  for (const auto& path : files) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const auto at = line.find_first_not_of(" \t");
      if (at == std::string::npos || line[at] == '#' || line.compare(at, name.size(), name) != 0) continue;
      const auto eq = line.find_first_not_of(" \t", at + name.size());
      if (eq == std::string::npos || line[eq] != '=') continue;  // another parameter with this prefix
      const auto v = line.find_first_not_of(" \t", eq + 1);
      const auto end = line.find_last_not_of(" \t\r");
      values.push_back(v == std::string::npos || end < v ? "" : line.substr(v, end - v + 1));
    }
  }
  return values;
}

bool user_chose(const char* param) {
  return std::getenv((std::string("OMPI_MCA_") + param).c_str()) || !parameter_file_values(param).empty();
}

// Whether no one chose OpenMPI's pml: not the environment (nor mpirun --mca),
// not a parameter file, unless the file only excludes others (Debian's own
// says "pml = ^ucx"), which ob1 honours.
bool pml_left_to_us() {
  if (std::getenv("OMPI_MCA_pml")) return false;
  for (const auto& v : parameter_file_values("pml"))
    if (v.empty() || v[0] != '^' || v.find("ob1") != std::string::npos) return false;
  return true;
}

}  // namespace

// OpenMPI's shared-memory BTL (vader) backs each rank's segment with a file
// in /dev/shm, removed when the job ends well; a job ended by Ctrl-C, a
// crash or a time-out can leave them there, memory no one frees. In the job's
// session directory, which mpirun removes at every end of a job (an aborted
// one too), they go with the job. The user's own choice (environment,
// mpirun --mca, parameter file) stands.
void keep_shared_memory_in_session_directory() {
  const char* session = std::getenv("OMPI_MCA_orte_jobfam_session_dir");
  if (!session || user_chose("btl_vader_backing_directory")) return;
  setenv("OMPI_MCA_btl_vader_backing_directory", session, 0);
}

void lighten_start_up_on_one_host() {
  const char* world = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  bool one_host = false;
  if (world) {
    one_host = local && std::string(local) == world;
  } else {
    // No mpirun: a singleton, unless another launcher started this process.
    one_host = true;
    for (const char* var : {"PMIX_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_STEP_ID", "SLURM_PROCID"})
      if (std::getenv(var)) one_host = false;
  }
  if (!one_host) return;
  if (pml_left_to_us()) setenv("OMPI_MCA_pml", "ob1", 0);
  // Nor does MPI_Init need hwloc to find this host's PCI devices (network
  // cards, for placing ranks near them): every rank read each device's PCI
  // configuration from sysfs, 8% of a 16-rank flux_tp run's CPU time
  // (0.98 -> 0.91 s). The user's HWLOC_COMPONENTS stands.
  setenv("HWLOC_COMPONENTS", "-pci,-linuxio", 0);
}

}  // namespace dc
