// Ulysses sequence-parallel attention over the `sp` communicator, with
// MaxDiffusion's head-chunked all-to-all: per chunk of heads, all-to-all #1
// (heads split, sequence gathered), flash attention over the full sequence for
// this rank's heads, all-to-all #2 back (sequence split, heads gathered).
// Schedules: blocking or non-blocking all-to-alls, and an overlapped pipeline
// (post chunk c+1's all-to-all, compute chunk c; double buffers).
#pragma once
#include <functional>
#include <vector>

#include "harness/core/comm.h"
#include "harness/core/dtype.h"
#include "harness/core/tensor.h"

namespace dc {

struct HeadChunk {
  std::size_t begin, end;  // global head range [begin, end)
};

// MaxDiffusion's rule: G = heads / shards groups, n = min(chunks, G) chunks of
// max(1, G / n) groups each, the last taking the remainder; times `shards`.
// Throws InputError unless heads % shards == 0 and chunks >= 1.
std::vector<HeadChunk> ulysses_head_chunks(std::size_t heads, std::size_t shards, std::size_t chunks);

struct UlyssesOptions {
  std::size_t chunks = 1;
  bool async = false;    // MPI_Ialltoall, waited before use
  bool overlap = false;  // pipeline: all-to-all of chunk c+1 in flight while chunk c computes
  bool fused = false;    // one all-to-all for q, k and v together
  std::size_t flash_block = 64;
  DType dtype = DType::float32;
  // Injected faults; each fires only when `async` and `overlap` are both on,
  // like the compiler bug it models.
  bool fault_read_before_wait = false;  // compute reads the receive buffer as posted (NaN-poisoned)
  bool fault_send_reuse = false;        // chunk c+1 is packed into the send buffer chunk c is sending
  // The attention of chunk c over the gathered sequence, head-major q, k, v
  // [heads of this rank, S, D] -> [heads of this rank, S, D]; default: flash
  // attention. (usp_attention puts ring attention here.)
  std::function<Tensor(std::size_t chunk, const Tensor& q, const Tensor& k, const Tensor& v)> attend;
};

// What a chunk looked like on this rank: head-major [heads of this rank, S, D].
using ChunkObserver = std::function<void(std::size_t index, const HeadChunk&, const Tensor& q,
                                         const Tensor& k, const Tensor& v, const Tensor& attn)>;

// q, k, v: this rank's tokens [S/P, H, D] (k already scaled) -> attention
// output for this rank's tokens, [S/P, H, D].
Tensor ulysses_attention(const Comm& sp, const Tensor& q, const Tensor& k, const Tensor& v,
                         const UlyssesOptions& opt, const ChunkObserver& observe);

}  // namespace dc
