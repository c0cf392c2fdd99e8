// A non-blocking collective's handle (core/comm.h): waited for at the
// latest when it is replaced or destroyed, so no operation is left running.
#include <mpi.h>
#include <spdlog/spdlog.h>

#include "harness/core/comm.h"
#include "harness/core/comm_impl.h"
#include "harness/core/error.h"

namespace dc {

using comm_detail::world_rank_or_zero;

Request::Request() = default;
Request::Request(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Request::Request(Request&&) noexcept = default;
Request& Request::operator=(Request&& o) noexcept {
  if (this != &o) {
    if (pending()) {
      try {
        wait();
      } catch (const std::exception& e) {
        spdlog::error("{}", e.what());
      }
    }
    impl_ = std::move(o.impl_);
  }
  return *this;
}
Request::~Request() {
  if (!pending()) return;
  try {
    wait();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
  }
}

bool Request::pending() const { return impl_ != nullptr; }

void Request::wait() {
  if (!impl_) return;
  auto impl = std::move(impl_);
  std::vector<MPI_Request*> reqs{&impl->req, &impl->req2};
  for (MPI_Request& r : impl->more) reqs.push_back(&r);
  for (MPI_Request* req : reqs) {
    if (*req == MPI_REQUEST_NULL) continue;
    int rc = MPI_Wait(req, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      char msg[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(rc, msg, &len);
      fail("rank {}: MPI_Wait for {} failed: {}", world_rank_or_zero(), impl->what,
           std::string(msg, len));
    }
  }
  if (impl->on_complete) impl->on_complete();
}

}  // namespace dc
