// Unified sequence-parallel attention over a joint [text | image] sequence
// (xDiT's USP for FLUX/SD3 with the text "joint" tokens): the image tokens
// are split over ring x sp, the text tokens are replicated on every rank.
// Image q/k/v go through the Ulysses all-to-alls over `sp` and the ring over
// `ring`; the text keys and values join every rank's attention exactly once
// (a block merged by its log-sum-exp), and the text queries ride along with
// each rank's image queries; the text output, computed for this rank's heads,
// is taken from ring rank 0 (the ring ranks merge their blocks in different
// orders) and all-gathered over `sp`.
#pragma once
#include <cstddef>

#include "harness/core/comm.h"
#include "harness/core/tensor.h"
#include "scenarios/ring_attention.h"
#include "scenarios/ulysses_attention.h"

namespace dc {

struct JointAttentionOptions {
  UlyssesOptions ulysses;  // its `attend` is set here
  RingOptions ring;
  // The bug of sglang#33327: the replicated text K/V are packed into the
  // image block that travels the ring, so text is attended `ring` times.
  bool fault_text_kv_rotated = false;
  double fault_scale = 1.0;  // --fault-scale: the output A of the way to the rotated one
};

// q, k, v: this rank's rows [text (`text` rows) | its image block], [rows, H, D],
// q and k normed and rotated, k NOT scaled. Returns the attention output of
// the same rows, [rows, H, D]: text rows equal on every rank of sp x ring.
Tensor joint_usp_attention(const Comm& sp, const Comm& ring, std::size_t text, const Tensor& q, const Tensor& k,
                           const Tensor& v, const JointAttentionOptions& opt);

// The exact attention of `q` (any rows) over all keys: the text rows of
// k and v, then the image rows of every part in turn, as `gather_image`
// (an all-gather over the parts, in token order) returns them. Float64.
RefTensor joint_reference_attention(std::size_t text, const RefTensor& q, const RefTensor& k, const RefTensor& v,
                                    const std::function<RefTensor(const RefTensor&)>& gather_image);

}  // namespace dc
