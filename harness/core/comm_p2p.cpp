// Comm's point-to-point operations: ordered send/recv between a pair, the
// personalized exchange of known sizes, and the neighbour exchange of halos.
// None is a collective, so none exchanges a fingerprint; the neighbour
// exchange still names itself to the progress record, so that a rank stuck
// waiting for a neighbour is reported at that operation.
#include <mpi.h>

#include <algorithm>

#include "harness/core/comm.h"
#include "harness/core/comm_impl.h"
#include "harness/core/error.h"
#include "harness/core/progress.h"

namespace dc {

using namespace comm_detail;

template <class T>
void Comm::send(std::span<const T> buf, int dest) const {
  check(MPI_Send(buf.data(), to_int_count(buf.size(), "MPI_Send", *impl_), mpi_type<T>(), dest, 7,
                 impl_->comm),
        "MPI_Send", *impl_);
}

template <class T>
void Comm::recv(std::span<T> buf, int source) const {
  check(MPI_Recv(buf.data(), to_int_count(buf.size(), "MPI_Recv", *impl_), mpi_type<T>(), source, 7,
                 impl_->comm, MPI_STATUS_IGNORE),
        "MPI_Recv", *impl_);
}

std::vector<std::vector<double>> Comm::exchange_known(
    const std::vector<std::vector<double>>& to_each, const std::vector<std::size_t>& from_counts) const {
  const auto n = static_cast<std::size_t>(impl_->size);
  if (to_each.size() != n || from_counts.size() != n)
    fail("rank {}: exchange_known on '{}' given {}/{} entries for {} ranks", impl_->rank, impl_->name,
         to_each.size(), from_counts.size(), n);
  std::vector<std::vector<double>> out(n);
  std::vector<MPI_Request> reqs;
  constexpr int kTag = 8;
  for (std::size_t r = 0; r < n; ++r) {
    if (from_counts[r] == 0) continue;
    out[r].resize(from_counts[r]);
    reqs.emplace_back();
    check(MPI_Irecv(out[r].data(), to_int_count(from_counts[r], "MPI_Irecv", *impl_), MPI_DOUBLE,
                    static_cast<int>(r), kTag, impl_->comm, &reqs.back()),
          "MPI_Irecv(exchange)", *impl_);
  }
  for (std::size_t r = 0; r < n; ++r) {
    if (to_each[r].empty()) continue;
    reqs.emplace_back();
    check(MPI_Isend(to_each[r].data(), to_int_count(to_each[r].size(), "MPI_Isend", *impl_), MPI_DOUBLE,
                    static_cast<int>(r), kTag, impl_->comm, &reqs.back()),
          "MPI_Isend(exchange)", *impl_);
  }
  if (!reqs.empty())
    check(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), "MPI_Waitall(exchange)",
          *impl_);
  return out;
}

template <class T>
Request Comm::iexchange(const std::vector<Message<const T>>& sends, const std::vector<Message<T>>& recvs) const {
  progress::entered_collective("neighbour_exchange", impl_->name);
  auto r = std::make_unique<Request::Impl>();
  r->what = "neighbour exchange (MPI_Isend/MPI_Irecv) on '" + impl_->name + "'";
  const auto peer_ok = [&](const auto& m, const char* op) {
    if (m.peer < 0 || m.peer >= impl_->size)
      fail("rank {}: {} on '{}' addresses rank {} of a group of {}", impl_->world_rank, op, impl_->name, m.peer,
           impl_->size);
  };
  r->more.reserve(sends.size() + recvs.size());
  for (const auto& m : recvs) {
    peer_ok(m, "MPI_Irecv(neighbour exchange)");
    r->more.emplace_back();
    check(MPI_Irecv(m.data.data(), to_int_count(m.data.size(), "MPI_Irecv", *impl_), mpi_type<T>(), m.peer, m.tag,
                    impl_->comm, &r->more.back()),
          "MPI_Irecv(neighbour exchange)", *impl_);
  }
  for (const auto& m : sends) {
    peer_ok(m, "MPI_Isend(neighbour exchange)");
    r->more.emplace_back();
    check(MPI_Isend(m.data.data(), to_int_count(m.data.size(), "MPI_Isend", *impl_), mpi_type<T>(), m.peer, m.tag,
                    impl_->comm, &r->more.back()),
          "MPI_Isend(neighbour exchange)", *impl_);
  }
  return Request(std::move(r));
}

#define DC_INSTANTIATE(T)                                                                  \
  template void Comm::send<T>(std::span<const T>, int) const;                              \
  template void Comm::recv<T>(std::span<T>, int) const;                                    \
  template Request Comm::iexchange<T>(const std::vector<Message<const T>>&,                \
                                      const std::vector<Message<T>>&) const;
DC_INSTANTIATE(float)
DC_INSTANTIATE(double)
#undef DC_INSTANTIATE

}  // namespace dc
