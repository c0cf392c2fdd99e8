#include "harness/core/watchdog.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include "harness/core/interrupt.h"
#include "harness/core/mesh.h"
#include "harness/core/progress.h"

namespace dc {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string file_of(const std::string& dir, int rank) { return fmt::format("{}/rank{}", dir, rank); }

// collective \t op \t group \t tap \t last_change
std::string encode(const progress::Snapshot& s) {
  return fmt::format("{}\t{}\t{}\t{}\t{:.3f}\n", s.collective, s.op, s.group, s.tap, s.last_change);
}

std::optional<progress::Snapshot> read_record(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  std::vector<std::string> f;
  std::stringstream ss(line);
  for (std::string x; std::getline(ss, x, '\t');) f.push_back(x);
  if (f.size() != 5) return std::nullopt;
  progress::Snapshot s;
  try {
    s.collective = std::stoll(f[0]);
    s.last_change = std::stod(f[4]);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  s.op = f[1], s.group = f[2], s.tap = f[3];
  return s;
}

std::string collective_str(const progress::Snapshot& s) {
  if (s.collective == 0) return "no collective yet";
  return fmt::format("collective #{} ({} on '{}')", s.collective, s.op, s.group);
}

std::string tap_str(const progress::Snapshot& s) { return s.tap.empty() ? "no tap yet" : "last tap '" + s.tap + "'"; }

}  // namespace

void prepare_watch_directory(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  // Listed first, removed after (removing while iterating is unspecified).
  // Ranks sharing DIR remove the same files; a file already gone is fine.
  std::vector<std::filesystem::path> stale;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) stale.push_back(entry.path());
  for (const auto& path : stale) std::filesystem::remove(path, ec);
}

bool claim_hang_report(const std::string& dir) {
  const std::string path = dir + "/" + interrupt::kHangClaimName;
  const int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
  if (fd >= 0) {
    ::close(fd);
    return true;
  }
  return errno != EEXIST;
}

Watchdog::Watchdog(std::string dir, int rank, int world, double timeout_seconds, bool dir_shared)
    : dir_(std::move(dir)), rank_(rank), world_(world), timeout_(timeout_seconds), dir_shared_(dir_shared) {
  if (timeout_ > 0) thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::error_code ec;
  std::filesystem::remove(file_of(dir_, rank_), ec);
}

// The HANG report: where each rank is, the ranks that never entered the
// collective the others wait in, and those with no record.
std::string Watchdog::hang_report(const std::map<int, progress::Snapshot>& all, const std::vector<int>& silent,
                                  const progress::Snapshot& me, double stalled) const {
  std::string msg = fmt::format("diffcheck [rank {}] HANG: no progress for {:.0f} s (--timeout {:g})\n", rank_,
                                stalled, timeout_);
  long long front = 0;
  for (const auto& [r, s] : all) front = std::max(front, s.collective);
  std::vector<int> waiting;
  progress::Snapshot at_front;
  for (const auto& [r, s] : all)
    if (s.collective == front) {
      waiting.push_back(r);
      at_front = s;
    }
  for (const auto& [r, s] : all)
    if (s.collective < front)
      msg += fmt::format("  rank {} never entered {}: it last entered {}, {}\n", r, collective_str(at_front),
                         s.collective ? fmt::format("#{} ({} on '{}')", s.collective, s.op, s.group) : "none",
                         tap_str(s));
  if (!waiting.empty())
    msg += fmt::format("  rank{} {} {} in {}, {}\n", waiting.size() > 1 ? "s" : "", rank_ranges(waiting),
                       waiting.size() > 1 ? "wait" : "waits", collective_str(at_front), tap_str(at_front));
  if (!silent.empty() && dir_shared_)
    msg += fmt::format("  rank{} {}: no progress record in {} (never started, died, or the disk is full)\n",
                       silent.size() > 1 ? "s" : "", rank_ranges(silent), dir_);
  if (!silent.empty() && !dir_shared_)
    msg += fmt::format("  rank{} {}: no progress record in {}: on another host (the directory is not shared "
                       "between hosts), never started, or died\n",
                       silent.size() > 1 ? "s" : "", rank_ranges(silent), dir_);
  if (!all.count(rank_))  // at least this rank's own state
    msg += fmt::format("  rank {} (this rank) is at {}, {}\n", rank_, collective_str(me), tap_str(me));
  return msg;
}

void Watchdog::loop() {
  const std::string mine = file_of(dir_, rank_), tmp = mine + ".tmp";
  std::string last;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (wake_.wait_for(lock, std::chrono::milliseconds(500), [this] { return stop_; })) return;
    }
    if (interrupt::stopping()) return;  // the stop handler removes the records and ends the rank
    const auto me = progress::snapshot();
    const std::string rec = encode(me);
    if (rec != last) {  // replaced whole, so a reader never sees half a record
      std::ofstream(tmp) << rec;
      std::error_code ec;
      std::filesystem::rename(tmp, mine, ec);
      last = rec;
    }
    const double stalled = now() - me.last_change;
    if (stalled < timeout_) continue;
    // Every rank's record; a rank without one never got that far (or died).
    std::map<int, progress::Snapshot> all;
    std::vector<int> silent, stuck;
    for (int r = 0; r < world_; ++r) {
      auto s = read_record(file_of(dir_, r));
      if (!s) {
        silent.push_back(r);
        continue;
      }
      all[r] = *s;
      if (now() - s->last_change >= timeout_) stuck.push_back(r);
    }
    // A rank that still makes progress (rank 0 checking the run file while
    // the others wait for its verdict) is no hang: the time runs from the
    // last progress of any rank.
    if (stuck.size() + silent.size() < static_cast<std::size_t>(world_)) continue;
    // The lowest rank that is stuck or silent speaks (silent: its record is
    // missing, e.g. a full disk kept it from being written).
    std::vector<int> candidates = stuck;
    candidates.insert(candidates.end(), silent.begin(), silent.end());
    candidates.push_back(rank_);
    const bool reporter = *std::min_element(candidates.begin(), candidates.end()) == rank_ &&
                          !interrupt::stopping() && claim_hang_report(dir_);
    if (!reporter) {
      // The reporter speaks and the job ends; should it not, end this rank.
      if (stalled >= timeout_ + 15) {
        interrupt::remove_partial_files(false);
        _exit(1);
      }
      continue;
    }
    // The hang began at the last progress of any rank, not of this one: a
    // rank that stalled early (waiting in a collective while the others still
    // computed) would otherwise report all of its own wait as the hang's.
    // Every rank with a record is stuck here, so this is at least the limit.
    double since = stalled;
    for (const auto& [r, s] : all) since = std::min(since, now() - s.last_change);
    std::string msg = hang_report(all, silent, me, since);
    msg += "HANG: the run is ended (exit 1)\n";
    ssize_t ignored = write(2, msg.data(), msg.size());
    (void)ignored;
    interrupt::remove_partial_files(false);  // the others remove the claim when the launcher ends them
    _exit(1);  // the launcher ends the other ranks
  }
}

}  // namespace dc
