#include "harness/core/comm.h"

#include <mpi.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <climits>
#include <functional>

#include "harness/core/comm_impl.h"
#include "harness/core/comm_native.h"
#include "harness/core/error.h"
#include "harness/core/mpi_settings.h"
#include "harness/core/progress.h"

namespace dc {

namespace comm_detail {

int world_rank_or_zero() {
  int init = 0, fin = 0, r = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

void check(int rc, const char* op, const Comm::Impl& c) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail("rank {}: {} on communicator '{}' failed: {}", c.world_rank, op, c.name,
       std::string(msg, len));
}

int to_int_count(std::size_t n, const char* op, const Comm::Impl& c) {
  if (n > static_cast<std::size_t>(INT_MAX))
    fail("rank {}: {} on '{}': {} elements exceed MPI's int count", c.world_rank, op, c.name, n);
  return static_cast<int>(n);
}

// Every rank states what it is about to do. The common case costs one
// all-reduce of six numbers whatever the group size: the max of each field and
// of its negation (the min) agree only when every rank agrees. Only on a
// mismatch do the ranks exchange the whole table, so that every rank reports
// the same offending group rank instead of hanging.
void fingerprint(const Comm::Impl& c, const char* op, std::size_t count) {
  const long long number = progress::entered_collective(op, c.name);
  if (c.size == 1) return;
  long long mine[3] = {c.seq++, static_cast<long long>(std::hash<std::string>{}(op) & 0xffffffff),
                       static_cast<long long>(count)};
  long long bounds[6] = {mine[0], mine[1], mine[2], -mine[0], -mine[1], -mine[2]};
  check(MPI_Allreduce(MPI_IN_PLACE, bounds, 6, MPI_LONG_LONG, MPI_MAX, c.comm),
        "MPI_Allreduce(fingerprint)", c);
  if (bounds[0] == -bounds[3] && bounds[1] == -bounds[4] && bounds[2] == -bounds[5]) return;
  std::vector<long long> all(3 * c.size);
  check(MPI_Allgather(mine, 3, MPI_LONG_LONG, all.data(), 3, MPI_LONG_LONG, c.comm),
        "MPI_Allgather(fingerprint)", c);
  // Every rank of the group sees the same table and throws alike.
  for (int r = 0; r < c.size; ++r) {
    if (all[3 * r] != all[0] || all[3 * r + 1] != all[1] || all[3 * r + 2] != all[2])
      throw Finding(fmt::format("DESYNC: collective mismatch on '{}' (collective #{} of rank {}): group rank 0 is at "
                                "call #{} with {} elements, group rank {} at call #{} with {} elements (a different "
                                "operation or size); rank {} called {}",
                                c.name, number, c.world_rank, all[0], all[2], r, all[3 * r], all[3 * r + 2],
                                c.world_rank, op),
                    true);
  }
}

}  // namespace comm_detail

using namespace comm_detail;

namespace {

template <class T>
void ordered_sum_chunks(const std::vector<T>& recv, std::size_t chunk, int n, T* out) {
  // Accumulate in double whatever T is, always in rank order 0..n-1.
  for (std::size_t i = 0; i < chunk; ++i) {
    double acc = 0.0;
    for (int r = 0; r < n; ++r) acc += static_cast<double>(recv[r * chunk + i]);
    out[i] = static_cast<T>(acc);
  }
}

}  // namespace

MPI_Comm CommAccess::native(const Comm& c) { return c.impl_->comm; }

void Comm::init(int* argc, char*** argv) {
  keep_shared_memory_in_session_directory();
  lighten_start_up_on_one_host();
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

void Comm::finalize() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

bool Comm::initialized() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

void Comm::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

Comm Comm::world() {
  auto impl = std::make_shared<Impl>();
  impl->name = "world";
  impl->world_rank = world_rank_or_zero();
  check(MPI_Comm_dup(MPI_COMM_WORLD, &impl->comm), "MPI_Comm_dup", *impl);
  check(MPI_Comm_set_errhandler(impl->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", *impl);
  MPI_Comm_rank(impl->comm, &impl->rank);
  MPI_Comm_size(impl->comm, &impl->size);
  return Comm(impl);
}

Comm Comm::split(const Mesh& mesh, const std::vector<std::string>& axes) const {
  mesh.require_world(size());
  std::vector<std::string> others;
  for (const auto& a : mesh.axes())
    if (std::find(axes.begin(), axes.end(), a.name) == axes.end()) others.push_back(a.name);
  for (const auto& a : axes) mesh.axis_size(a);  // throws for unknown axes
  auto impl = std::make_shared<Impl>();
  impl->world_rank = impl_->world_rank;
  impl->name.clear();
  for (const auto& a : axes) impl->name += (impl->name.empty() ? "" : "*") + a;
  if (impl->name.empty()) impl->name = "self";
  int color = mesh.index_in(rank(), others);
  fingerprint(*impl_, "split", static_cast<std::size_t>(axes.size()));
  check(MPI_Comm_split(impl_->comm, color, rank(), &impl->comm), "MPI_Comm_split", *impl_);
  check(MPI_Comm_set_errhandler(impl->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", *impl);
  MPI_Comm_rank(impl->comm, &impl->rank);
  MPI_Comm_size(impl->comm, &impl->size);
  return Comm(impl);
}

int Comm::rank() const { return impl_->rank; }
int Comm::size() const { return impl_->size; }
const std::string& Comm::name() const { return impl_->name; }

void Comm::barrier() const {
  fingerprint(*impl_, "barrier", 0);
  check(MPI_Barrier(impl_->comm), "MPI_Barrier", *impl_);
}

template <class T>
void Comm::broadcast(std::span<T> buf, int root) const {
  fingerprint(*impl_, "broadcast", buf.size());
  check(MPI_Bcast(buf.data(), to_int_count(buf.size(), "MPI_Bcast", *impl_), mpi_type<T>(), root,
                  impl_->comm),
        "MPI_Bcast", *impl_);
}

template <class T>
Request Comm::ibroadcast(std::span<T> buf, int root) const {
  fingerprint(*impl_, "ibroadcast", buf.size());
  auto r = std::make_unique<Request::Impl>();
  r->what = "MPI_Ibcast on '" + impl_->name + "'";
  check(MPI_Ibcast(buf.data(), to_int_count(buf.size(), "MPI_Ibcast", *impl_), mpi_type<T>(), root,
                   impl_->comm, &r->req),
        "MPI_Ibcast", *impl_);
  return Request(std::move(r));
}

template <class T>
void Comm::all_reduce_sum(std::span<T> buf) const {
  iall_reduce_sum(buf).wait();
}

// Deterministic all-reduce: an all-to-all moves chunk i of every rank to rank i,
// which sums them in rank order; an all-gather returns the sums to everyone.
template <class T>
Request Comm::iall_reduce_sum(std::span<T> buf) const {
  fingerprint(*impl_, "all_reduce_sum", buf.size());
  auto r = std::make_unique<Request::Impl>();
  r->what = "all_reduce_sum on '" + impl_->name + "'";
  const int n = impl_->size;
  if (n == 1) return Request(std::move(r));
  const std::size_t chunk = (buf.size() + n - 1) / n;
  auto send = std::make_shared<std::vector<T>>(chunk * n, T{});
  std::copy(buf.begin(), buf.end(), send->begin());
  auto recv = std::make_shared<std::vector<T>>(chunk * n);
  int cnt = to_int_count(chunk, "MPI_Ialltoall", *impl_);
  check(MPI_Ialltoall(send->data(), cnt, mpi_type<T>(), recv->data(), cnt, mpi_type<T>(),
                      impl_->comm, &r->req),
        "MPI_Ialltoall(all_reduce)", *impl_);
  const Impl* c = impl_.get();
  r->on_complete = [c, send, recv, chunk, n, buf, cnt]() {
    std::vector<T> mine(chunk);
    ordered_sum_chunks(*recv, chunk, n, mine.data());
    check(MPI_Allgather(mine.data(), cnt, mpi_type<T>(), send->data(), cnt, mpi_type<T>(), c->comm),
          "MPI_Allgather(all_reduce)", *c);
    std::copy(send->begin(), send->begin() + buf.size(), buf.begin());
  };
  return Request(std::move(r));
}

template <class T>
std::vector<T> Comm::all_gather(std::span<const T> mine) const {
  fingerprint(*impl_, "all_gather", mine.size());
  std::vector<T> out(mine.size() * impl_->size);
  int cnt = to_int_count(mine.size(), "MPI_Allgather", *impl_);
  check(MPI_Allgather(mine.data(), cnt, mpi_type<T>(), out.data(), cnt, mpi_type<T>(), impl_->comm),
        "MPI_Allgather", *impl_);
  return out;
}

template <class T>
std::vector<T> Comm::reduce_scatter_sum(std::span<const T> buf) const {
  const int n = impl_->size;
  if (buf.size() % n != 0)
    fail("rank {}: reduce_scatter_sum on '{}': {} elements do not split into {} equal blocks",
         impl_->world_rank, impl_->name, buf.size(), n);
  fingerprint(*impl_, "reduce_scatter_sum", buf.size());
  const std::size_t chunk = buf.size() / n;
  std::vector<T> recv(buf.size());
  int cnt = to_int_count(chunk, "MPI_Alltoall", *impl_);
  check(MPI_Alltoall(buf.data(), cnt, mpi_type<T>(), recv.data(), cnt, mpi_type<T>(), impl_->comm),
        "MPI_Alltoall(reduce_scatter)", *impl_);
  std::vector<T> out(chunk);
  ordered_sum_chunks(recv, chunk, n, out.data());
  return out;
}

template <class T>
void Comm::all_to_all(std::span<const T> send, std::span<T> recv) const {
  iall_to_all(send, recv).wait();
}

template <class T>
Request Comm::iall_to_all(std::span<const T> send, std::span<T> recv) const {
  const int n = impl_->size;
  if (send.size() != recv.size() || send.size() % n != 0)
    fail("rank {}: all_to_all on '{}': send {} / recv {} elements are not {} equal blocks",
         impl_->world_rank, impl_->name, send.size(), recv.size(), n);
  fingerprint(*impl_, "all_to_all", send.size());
  auto r = std::make_unique<Request::Impl>();
  r->what = "MPI_Ialltoall on '" + impl_->name + "'";
  int cnt = to_int_count(send.size() / n, "MPI_Ialltoall", *impl_);
  check(MPI_Ialltoall(send.data(), cnt, mpi_type<T>(), recv.data(), cnt, mpi_type<T>(), impl_->comm,
                      &r->req),
        "MPI_Ialltoall", *impl_);
  return Request(std::move(r));
}

template <class T>
void Comm::ring_shift(std::span<const T> send, std::span<T> recv) const {
  iring_shift(send, recv).wait();
}

template <class T>
Request Comm::iring_shift(std::span<const T> send, std::span<T> recv) const {
  if (send.size() != recv.size())
    fail("rank {}: ring_shift on '{}': send {} / recv {} elements differ", impl_->world_rank, impl_->name,
         send.size(), recv.size());
  fingerprint(*impl_, "ring_shift", send.size());
  auto r = std::make_unique<Request::Impl>();
  r->what = "ring shift (MPI_Isend/MPI_Irecv) on '" + impl_->name + "'";
  const int n = impl_->size, cnt = to_int_count(send.size(), "MPI_Isend", *impl_);
  if (n == 1) {
    std::copy(send.begin(), send.end(), recv.begin());
    return Request(std::move(r));
  }
  constexpr int kTag = 7;
  check(MPI_Irecv(recv.data(), cnt, mpi_type<T>(), (impl_->rank + n - 1) % n, kTag, impl_->comm, &r->req2),
        "MPI_Irecv", *impl_);
  check(MPI_Isend(send.data(), cnt, mpi_type<T>(), (impl_->rank + 1) % n, kTag, impl_->comm, &r->req),
        "MPI_Isend", *impl_);
  return Request(std::move(r));
}

int Comm::max_int(int v) const {
  fingerprint(*impl_, "max_int", 1);
  int out = 0;
  check(MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MAX, impl_->comm), "MPI_Allreduce(max)", *impl_);
  return out;
}

double Comm::max_double(double v) const {
  fingerprint(*impl_, "max_double", 1);
  double out = 0;
  check(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, impl_->comm), "MPI_Allreduce(max)", *impl_);
  return out;
}

long long Comm::sum_ll(long long v) const {
  fingerprint(*impl_, "sum_ll", 1);
  long long out = 0;
  check(MPI_Allreduce(&v, &out, 1, MPI_LONG_LONG, MPI_SUM, impl_->comm), "MPI_Allreduce(sum)",
        *impl_);
  return out;
}

std::string Comm::broadcast_string(const std::string& s, int root) const {
  long long len = static_cast<long long>(s.size());
  fingerprint(*impl_, "broadcast_string", 0);
  check(MPI_Bcast(&len, 1, MPI_LONG_LONG, root, impl_->comm), "MPI_Bcast(length)", *impl_);
  std::string out = s;
  out.resize(static_cast<std::size_t>(len));
  check(MPI_Bcast(out.data(), to_int_count(out.size(), "MPI_Bcast", *impl_), MPI_CHAR, root,
                  impl_->comm),
        "MPI_Bcast(string)", *impl_);
  return out;
}

std::vector<std::string> Comm::all_gather_strings(const std::string& s) const {
  fingerprint(*impl_, "all_gather_strings", 0);
  int len = to_int_count(s.size(), "MPI_Allgatherv", *impl_);
  std::vector<int> lens(static_cast<std::size_t>(impl_->size)), at(lens.size(), 0);
  check(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, impl_->comm),
        "MPI_Allgather(lengths)", *impl_);
  long long total = 0;
  for (std::size_t r = 0; r < lens.size(); ++r) {
    at[r] = static_cast<int>(total);
    total += lens[r];
  }
  std::string all(static_cast<std::size_t>(to_int_count(static_cast<std::size_t>(total),
                                                         "MPI_Allgatherv", *impl_)),
                  '\0');
  check(MPI_Allgatherv(s.data(), len, MPI_CHAR, all.data(), lens.data(), at.data(), MPI_CHAR,
                       impl_->comm),
        "MPI_Allgatherv(strings)", *impl_);
  std::vector<std::string> out;
  for (std::size_t r = 0; r < lens.size(); ++r)
    out.push_back(all.substr(static_cast<std::size_t>(at[r]), static_cast<std::size_t>(lens[r])));
  return out;
}

#define DC_INSTANTIATE(T)                                                      \
  template void Comm::broadcast<T>(std::span<T>, int) const;                   \
  template Request Comm::ibroadcast<T>(std::span<T>, int) const;               \
  template void Comm::all_reduce_sum<T>(std::span<T>) const;                   \
  template Request Comm::iall_reduce_sum<T>(std::span<T>) const;               \
  template std::vector<T> Comm::all_gather<T>(std::span<const T>) const;       \
  template std::vector<T> Comm::reduce_scatter_sum<T>(std::span<const T>) const; \
  template void Comm::all_to_all<T>(std::span<const T>, std::span<T>) const;   \
  template Request Comm::iall_to_all<T>(std::span<const T>, std::span<T>) const; \
  template void Comm::ring_shift<T>(std::span<const T>, std::span<T>) const;   \
  template Request Comm::iring_shift<T>(std::span<const T>, std::span<T>) const;
DC_INSTANTIATE(float)
DC_INSTANTIATE(double)
#undef DC_INSTANTIATE

}  // namespace dc
