// PendingRunFile (store.h): a run file whose rows and boxes may still be
// going out on the ranks' threads, finished (waited for, renamed into place)
// or, destroyed unfinished, removed.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <thread>
#include <utility>

#include "harness/capture/store.h"
#include "harness/capture/store_layout.h"
#include "harness/core/error.h"

namespace dc {

PendingRunFile::PendingRunFile(const Comm& world, std::string path, std::unique_ptr<PositionalWrites> writes)
    : world_(&world), path_(std::move(path)) {
  add(std::move(writes));
}

void PendingRunFile::add(std::unique_ptr<PositionalWrites> writes) {
  if (writes) writes_.push_back(std::move(writes));
}

PendingRunFile::PendingRunFile(PendingRunFile&& o) noexcept
    : world_(std::exchange(o.world_, nullptr)),  // the moved-from one removes nothing
      path_(std::move(o.path_)),
      writes_(std::move(o.writes_)),
      finished_(o.finished_),
      background_s_(o.background_s_) {}

PendingRunFile::~PendingRunFile() {
  if (finished_ || !world_) return;
  writes_.clear();  // joins this rank's writers
  // Not collective (an error is unwinding): rank 0 removes what the ranks
  // wrote; a rank still writing writes into a file no name reaches.
  if (world_->rank() == 0) {
    std::error_code ec;
    std::filesystem::remove(path_ + ".tmp", ec);
  }
}

void PendingRunFile::finish() {
  finished_ = true;
  const Comm& world = *world_;
  const int rank = world.rank();
  const std::string& path = path_;
  const std::string tmp = path + ".tmp";
  for (auto& w : writes_) {
    w->wait(path);
    background_s_ += w->seconds();
  }
  writes_.clear();
  int failed = 0;
  std::string why;
  if (rank == 0) {
    // Renaming over an earlier run file unlinks it, and the kernel frees its
    // pages there and then (0.65 s for flux1-dev's 4.5 GB, all ranks
    // waiting): held open across the rename, it is freed when a thread of
    // its own closes it, beside the check.
    const int earlier = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) {
      failed = 1;
      why = ec.message();
    }
    if (earlier >= 0) std::thread([earlier] { ::close(earlier); }).detach();
  }
  if (world.max_int(failed) != 0)
    fail("rank {}: cannot rename '{}' to '{}': {}", rank, tmp, path,
         rank == 0 ? why : "see rank 0");
}

}  // namespace dc
