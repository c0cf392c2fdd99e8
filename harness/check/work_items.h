// How the comparator spreads a tap's items (chunk x block) over threads and
// processes and merges their statistics into the same result whatever the
// spread; for a distributed source, in rounds after each round's reads are
// staged. Included by compare.cpp only.
#pragma once
#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "harness/capture/activations.h"
#include "harness/core/agree.h"
#include "harness/check/tap_stats.h"
#include "harness/core/comm.h"
#include "harness/core/error.h"
#include "harness/core/progress.h"

namespace dc {

// Where the items of a tap run: this process's threads, and the processes
// that share the work (each takes the items i with i % size == rank).
struct Workers {
  int threads = 1;
  const Comm* processes = nullptr;  // null: this process alone
  int rank() const { return processes ? processes->rank() : 0; }
  int size() const { return processes ? processes->size() : 1; }
};

// Items `items` on up to `threads` threads, each thread with its own stats,
// merged. The first exception (e.g. an unreadable file) stops the other
// threads and is rethrown.
template <class Work>
TapStats run_item_list(const std::vector<std::size_t>& items, int threads_wanted, Work& work) {
  int threads = static_cast<int>(std::min<std::size_t>(std::max(1, threads_wanted), std::max<std::size_t>(items.size(), 1)));
  std::vector<TapStats> parts(static_cast<std::size_t>(threads));
  std::atomic<std::size_t> next{0};
  std::atomic<bool> stop{false};
  std::exception_ptr error;
  std::mutex error_mu;
  auto loop = [&](int k) {
    try {
      for (std::size_t j; !stop && (j = next++) < items.size();) {
        progress::working();  // a long check is progress for the run's watchdog
        work(items[j], parts[static_cast<std::size_t>(k)], k);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
      stop = true;
    }
  };
  if (threads == 1) {
    loop(0);
  } else {
    std::vector<std::thread> pool;
    for (int k = 0; k < threads; ++k) pool.emplace_back(loop, k);
    for (auto& t : pool) t.join();
  }
  if (error) std::rethrow_exception(error);
  TapStats all;
  for (const auto& p : parts) all.merge(p);
  all.finish();  // compact: one per-rank entry per rank before it travels
  return all;
}

// This process's share of items 0..n-1 (i % size == rank) on its threads.
template <class Work>
TapStats run_local_items(std::size_t n, const Workers& w, Work& work) {
  std::vector<std::size_t> mine;
  for (std::size_t i = static_cast<std::size_t>(w.rank()); i < n; i += static_cast<std::size_t>(w.size()))
    mine.push_back(i);
  return run_item_list(mine, w.threads, work);
}

// Every process's stats from `local()`, merged on every process. Processes
// agree on failure as well: a process that could not read its share sends its
// error instead, and every process throws the lowest rank's error, so none
// waits for another.
template <class Local>
TapStats merge_processes(const Comm* processes, Local&& local) {
  if (!processes || processes->size() == 1) {
    TapStats s = local();
    s.finish();
    return s;
  }
  TapStats s;
  for (const auto& part : agreed_on_all(*processes, [&] { return local().encode(); }))
    s.merge(TapStats::decode(part));
  s.finish();
  return s;
}

// Every item's stats, merged on every process.
template <class Work>
TapStats run_items(std::size_t n, const Workers& w, Work&& work) {
  return merge_processes(w.processes, [&] { return run_local_items(n, w, work); });
}

// Items of a distributed source (see ActivationData::holders), in rounds: a
// round's items run on the process that plan(round) names for each, after
// the source has staged every process's reads of the round. A process whose
// work failed keeps joining the rounds (they are collective) and reports its
// error at the merge.
struct Round {
  std::vector<std::size_t> items;  // item numbers of the round
  std::vector<int> reader;         // per item, the process that runs it
  std::vector<PlannedRead> reads;  // of every process
};

template <class Plan, class Work>
TapStats run_rounds(const ActivationSet& set, const TapData& t, std::size_t rounds, int threads,
                    Plan&& plan, Work&& work) {
  const Comm* holders = set.data->holders();
  TapStats mine;
  std::exception_ptr error;
  for (std::size_t round = 0; round < rounds; ++round) {
    const Round r = plan(round);
    set.data->stage(t, r.reads);
    if (error) continue;
    std::vector<std::size_t> local;
    for (std::size_t i = 0; i < r.items.size(); ++i)
      if (r.reader[i] == holders->rank()) local.push_back(r.items[i]);
    try {
      mine.merge(run_item_list(local, threads, work));
    } catch (...) {
      error = std::current_exception();
    }
  }
  return merge_processes(holders, [&] {
    if (error) std::rethrow_exception(error);
    return mine;
  });
}

}  // namespace dc
