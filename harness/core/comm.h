// Subsystem core (harness/core/, library diffcheck_core) — the bottom layer.
// Owns the types every other part shares: BasicTensor and DType, the error
// types and exit codes, rank-prefixed logging, the Mesh of named axes, the
// Layout of a tap (which mesh axes shard or partially sum which dimension),
// scenario flags, and the communicator below — the only MPI code — with the
// reshard plans built on it. Depends on nothing of diffcheck; no HDF5.
//
// The only part of diffcheck that calls MPI. A Comm is a duplicated
// communicator with MPI_ERRORS_RETURN, so every failing call becomes an Error
// naming the rank, the operation, the axis group and MPI's own message.
//
// Before each collective the ranks exchange a fingerprint (sequence number,
// operation, element count); a mismatch — ranks calling different collectives
// or different sizes — is reported instead of hanging or corrupting memory.
//
// Reductions run in a fixed rank order, so every rank of a group gets the
// bitwise-same result (replica checks default to 0 ULP).
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "harness/core/mesh.h"

namespace dc {

class Request;

class Comm {
 public:
  // MPI_Init / MPI_Finalize; the environment is started once per process.
  static void init(int* argc, char*** argv);
  static void finalize();
  static bool initialized();
  // Ends every rank of the job with `code`; the last resort when one rank failed
  // alone and the others would otherwise wait for it forever.
  [[noreturn]] static void abort(int code);

  // A duplicate of MPI_COMM_WORLD.
  static Comm world();

  // The communicator of the ranks that differ from this one only along `axes`
  // (e.g. {"tp"}: this rank's tensor-parallel group). Ranks are ordered by their
  // mixed-radix index over `axes` in mesh order. Collective over this Comm.
  Comm split(const Mesh& mesh, const std::vector<std::string>& axes) const;

  int rank() const;
  int size() const;
  const std::string& name() const;  // "world" or the axis names, for messages

  void barrier() const;

  template <class T>
  void broadcast(std::span<T> buf, int root) const;
  template <class T>
  Request ibroadcast(std::span<T> buf, int root) const;

  // Sum over the group in rank order; every rank gets identical bits.
  template <class T>
  void all_reduce_sum(std::span<T> buf) const;
  template <class T>
  Request iall_reduce_sum(std::span<T> buf) const;

  // Concatenation of every rank's `mine` (all the same size), in rank order.
  template <class T>
  std::vector<T> all_gather(std::span<const T> mine) const;

  // `buf` holds size() equal blocks; rank i gets the rank-ordered sum of block i.
  template <class T>
  std::vector<T> reduce_scatter_sum(std::span<const T> buf) const;

  // `send` holds size() equal blocks, block i for rank i; `recv` gets block j
  // from rank j at position j.
  template <class T>
  void all_to_all(std::span<const T> send, std::span<T> recv) const;
  template <class T>
  Request iall_to_all(std::span<const T> send, std::span<T> recv) const;

  // One step of a ring: every rank sends `send` to the next rank of the group
  // (rank + 1 mod size) and receives the previous rank's into `recv` (same
  // size). Called by every rank of the group, like a collective.
  template <class T>
  void ring_shift(std::span<const T> send, std::span<T> recv) const;
  template <class T>
  Request iring_shift(std::span<const T> send, std::span<T> recv) const;

  // Point to point, in order between a pair of ranks (not collectives: no
  // fingerprint). For moving data to one rank in bounded pieces.
  template <class T>
  void send(std::span<const T> buf, int dest) const;
  template <class T>
  void recv(std::span<T> buf, int source) const;

  // A neighbour exchange (halos): messages to and from chosen ranks of this
  // group, all posted at once and waited together by the Request. Not a
  // collective: only the ranks with messages take part, and a message matches
  // the receive of the same peer and tag. The buffers must outlive the wait.
  template <class T>
  struct Message {
    int peer = 0;
    int tag = 0;
    std::span<T> data;
  };
  template <class T>
  Request iexchange(const std::vector<Message<const T>>& sends, const std::vector<Message<T>>& recvs) const;

  // Personalized exchange between the pairs that have something to move,
  // point to point, when every rank knows what it receives: `to_each[r]` goes
  // to rank r (empty: no message), and `from_counts[r]` values come from rank
  // r (0: no message); the result's entry r holds them. Ranks with nothing to
  // send or receive return at once.
  std::vector<std::vector<double>> exchange_known(const std::vector<std::vector<double>>& to_each,
                                                  const std::vector<std::size_t>& from_counts) const;

  // Small helpers for verdicts and metadata.
  int max_int(int v) const;
  double max_double(double v) const;
  long long sum_ll(long long v) const;
  std::string broadcast_string(const std::string& s, int root) const;
  // Every rank's `s` (any length), in rank order, on every rank.
  std::vector<std::string> all_gather_strings(const std::string& s) const;

  struct Impl;

 private:
  explicit Comm(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
  friend struct CommAccess;
};

// A non-blocking collective in flight. wait() must be called before the buffers
// are read or reused; destroying an unwaited Request waits (so a buffer is never
// freed under MPI's feet).
class Request {
 public:
  Request();
  Request(Request&&) noexcept;
  Request& operator=(Request&&) noexcept;
  ~Request();
  void wait();
  bool pending() const;

  struct Impl;
  explicit Request(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dc
