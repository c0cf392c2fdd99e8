// The run's watchdog: a thread per rank that writes where the rank is (see
// progress.h) to DIR/rank<R> twice a second. When no rank has made progress
// for the time limit (ranks waiting for one that still works are no hang), the lowest such rank reads every rank's file, prints
// which rank the others wait for — "rank 3 never entered collective #57
// (all_to_all on 'sp'); ranks 0-2, 4-15 wait in it" — and ends its process
// with status 1, so the launcher ends the job: a hang of the code under test
// is a finding, and no rank is left running. Ranks see each other's records at
// different moments, so two may each think they are the lowest stuck rank; the
// one that creates DIR/hang.reported first speaks, the other stays silent.
// DIR is the run file's directory plus ".watch"; where hosts do not share it
// (`dir_shared` false) each host's ranks see only each other's records (and
// claim), and the report says so of the others.
#pragma once
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "harness/core/progress.h"

namespace dc {

// Empties DIR (records and claim of an earlier run that was ended) and makes
// sure it exists. Every rank calls it before any watchdog of the run starts.
void prepare_watch_directory(const std::string& dir);

// True for the first caller per DIR (the hang report is this rank's to print);
// false once another rank has claimed it. Where the claim cannot be written
// (a full disk) it says true: two reports are better than none.
bool claim_hang_report(const std::string& dir);

class Watchdog {
 public:
  Watchdog(std::string dir, int rank, int world, double timeout_seconds, bool dir_shared = true);
  ~Watchdog();  // stops the thread at once and removes this rank's file
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  void loop();
  std::string hang_report(const std::map<int, progress::Snapshot>& all, const std::vector<int>& silent,
                          const progress::Snapshot& me, double stalled) const;
  std::string dir_;
  int rank_, world_;
  double timeout_;
  bool dir_shared_;
  // The thread waits on this between looks, so the end of a run does not
  // wait out its half-second sleep.
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dc
