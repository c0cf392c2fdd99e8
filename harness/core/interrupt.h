// What a run does when it is interrupted: SIGINT (Ctrl-C), or SIGTERM (mpirun
// passes a Ctrl-C on to the ranks as SIGTERM; batch schedulers send it at a
// job's time limit; the launcher sends it when a rank or host was lost).
//
// Every rank, in whatever phase (start-up, scenario, write, check) and
// whatever call it is in (a collective included), removes what the run was
// writing — the run file's FILE.tmp, the watch directory, a report's
// temporary, OpenMPI's semaphore for the file — and exits with status
// 128 + the signal (130, 143). The reporting rank (0) first prints one line:
//   diffcheck [rank 0] STOPPED by the launcher (SIGTERM) while writing the run file: ...; last collective #9
//   all_gather on 'tp'; last tap 'out'
// Once the run has its verdict the line is not printed (the launcher ending
// the job is then no news) but the removal still happens.
//
// Everything the handler uses lives in fixed buffers: it only calls
// write(2), unlink(2), getdents64(2), rmdir(2) and _exit(2).
#pragma once
#include <string>

namespace dc::interrupt {

// The status a rank ends with when stopped by `sig`.
constexpr int exit_status(int sig) { return 128 + sig; }

// Installs the SIGINT and SIGTERM handlers. Called first thing in a run
// (before MPI starts: Ctrl-C during start-up is handled too), with the rank
// the launcher's environment gives; `reporter`: this rank prints the line;
// `linger`: one of several ranks, it waits half a second before it exits so
// that the launcher does not kill the others before their handlers ran.
void install(int rank, bool reporter, bool linger);

// What the run is doing now, for the line ("writing the run file"). A
// string literal: the handler reads it as it is.
void set_phase(const char* phase);

// Which ranks run on which host ("h1: 0-7; h2: 8-15"), for the line.
void set_rank_hosts(const std::string& text);

// Removed by this rank when the run is stopped (or crashes, or reports a
// hang). Returns a slot for forget(); a path may be removed twice by ranks
// sharing it, and a path that is not there is fine.
int remove_when_stopped(const std::string& path);
void forget(int slot);

// The watch directory: every entry (the records of ranks that were killed
// outright among them; whichever rank gets there first clears it), then DIR.
// A rank's watchdog never makes DIR again, so once gone it stays gone.
void remove_directory_when_stopped(const std::string& dir);

// The file in the watch directory whose creation claims the hang report
// (watchdog.cpp); the hang reporter's clean-up keeps it.
constexpr char kHangClaimName[] = "hang.reported";

// The run has its verdict: no STOPPED line from now on.
void verdict_reached();

// This rank is being stopped (its handler runs): the watchdog, whose thread
// runs on while the handler waits, reports nothing.
bool stopping();

// Removes now what a stop would remove (async-signal-safe): for the crash
// handler, the hang reporter, and a rank ending the job with MPI_Abort. The
// hang reporter keeps the claim (`claim_too` false): while the other ranks
// live it is what keeps them from reporting the hang a second time.
void remove_partial_files(bool claim_too = true);

// While alive, `path` is removed when the run is stopped: a report's
// temporary between its creation and its rename.
class Removal {
 public:
  explicit Removal(const std::string& path) : slot_(remove_when_stopped(path)) {}
  ~Removal() { forget(slot_); }
  Removal(const Removal&) = delete;
  Removal& operator=(const Removal&) = delete;

 private:
  int slot_;
};

}  // namespace dc::interrupt
