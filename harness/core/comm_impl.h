// The insides of Comm and Request, shared by the files that implement them
// (comm.cpp: set-up and collectives; comm_p2p.cpp: point to point). Nothing
// outside harness/core/comm*.cpp includes this header.
#pragma once
#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "harness/core/comm.h"

namespace dc {

struct Comm::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  int world_rank = 0;
  std::string name;
  mutable long long seq = 0;
  ~Impl() {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

struct Request::Impl {
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Request req2 = MPI_REQUEST_NULL;  // the receive of a ring step
  std::vector<MPI_Request> more;        // a neighbour exchange's messages
  std::function<void()> on_complete;  // runs after the MPI request completes
  std::string what;
};

namespace comm_detail {

int world_rank_or_zero();
// Throws an Error naming the rank, the operation and the communicator.
void check(int rc, const char* op, const Comm::Impl& c);
int to_int_count(std::size_t n, const char* op, const Comm::Impl& c);
// Collectives only: see comm.cpp.
void fingerprint(const Comm::Impl& c, const char* op, std::size_t count);

template <class T>
MPI_Datatype mpi_type();
template <>
inline MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <>
inline MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }

}  // namespace comm_detail
}  // namespace dc
