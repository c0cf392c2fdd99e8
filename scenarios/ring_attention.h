// Ring attention over the `ring` communicator with log-sum-exp merges (the
// context-parallel half of unified sequence parallelism, as in yunchang's and
// xDiT's ring attention): each rank keeps its query block; the key/value
// blocks travel around the ring, one step per block; each step's partial
// output is merged into the running one through their log-sum-exps.
//
// Merge (two forms that appear in real code; both numerically stable):
//   sigmoid (yunchang, flash-attn's ring code):
//     out <- out - sigmoid(lse_b - lse) * (out - out_b);  lse <- lse - logsigmoid(lse - lse_b)
//   maxexp:
//     m = max(lse, lse_b); a = exp(lse - m); c = exp(lse_b - m);
//     out <- (a out + c out_b) / (a + c);                   lse <- m + log(a + c)
// The kernel returns its LSE token-major, [Sq, heads] (as the merge reads it).
#pragma once
#include <functional>
#include <utility>

#include "harness/core/comm.h"
#include "harness/core/dtype.h"
#include "harness/core/tensor.h"

namespace dc {

// Exact softmax attention of one block, accumulated in float64: q [h, Sq, D],
// k and v [h, Sk, D] (head-major, k pre-scaled) -> out [h, Sq, D] and
// lse [h, Sq] (log of the softmax denominator, head-major).
template <class T>
std::pair<BasicTensor<T>, BasicTensor<T>> block_attention(const BasicTensor<T>& q, const BasicTensor<T>& k,
                                                          const BasicTensor<T>& v);

// Merges one block's partial result into the running one: out and out_b
// [h, Sq, D]; lse and lse_b token-major [Sq, h] (the merge's layout).
template <class T>
void lse_merge(BasicTensor<T>& out, BasicTensor<T>& lse, const BasicTensor<T>& out_b, const BasicTensor<T>& lse_b,
               bool sigmoid_form);

struct RingOptions {
  bool overlap = false;        // post the next K/V transfer before computing the current block
  bool allgather = false;      // kv_transfer=allgather: every block at once instead of ring steps
  bool sigmoid_merge = true;   // merge=sigmoid (else maxexp)
  DType dtype = DType::float32;
  // Injected faults (scenario usp_attention):
  bool fault_lse_layout = false;  // the kernel hands its LSE over head-major [h, Sq]
  bool fault_lse_offset = false;  // the kernel smooths k by its block mean and leaves the LSE low
  double fault_lse_scale = 1.0;   // --fault-scale: the LSE is left low by this fraction of the offset
  bool fault_kv_reuse = false;    // with overlap: the next block lands in the buffer being read
};

// After each step: the merged output [h, Sq, D] and LSE [h, Sq] (head-major)
// over the blocks seen so far (step t: blocks r, r-1, ..., r-t of the ring).
using RingObserver = std::function<void(std::size_t step, const Tensor& out, const Tensor& lse)>;

// q: this rank's query block [h, Sq, D]; k, v: its key/value block [h, Sk, D]
// (every ring rank's block the same size). Returns the merged output and LSE.
std::pair<Tensor, Tensor> ring_attention(const Comm& ring, const Tensor& q, const Tensor& k, const Tensor& v,
                                         const RingOptions& opt, const RingObserver& observe);

}  // namespace dc
