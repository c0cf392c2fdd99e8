// The whole-tensor check of one tap (compare's work for a tap that is not a
// sketch): its chunks read and scanned by the workers (non-finite values,
// replicas against their leader, values against the reference), and the
// statistics turned into the tap's verdict.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "harness/capture/activations.h"
#include "harness/check/compare.h"
#include "harness/check/work_items.h"

namespace dc {

// A chunk's values. Not zeroed when made: every use writes before it reads,
// and a page no tap needs (the replica and sum buffers of a tap on one rank)
// is then never touched, where zeroing cost a first touch of each.
class ChunkBuffer {
 public:
  explicit ChunkBuffer(std::size_t n) : values_(new double[n]) {}
  double* data() { return values_.get(); }
  double& operator[](std::size_t i) { return values_[i]; }

 private:
  std::unique_ptr<double[]> values_;
};

// One worker's buffers of `chunk` values each.
struct ChunkBuffers {
  ChunkBuffer leader, other, sum, ref;
  explicit ChunkBuffers(std::size_t n) : leader(n), other(n), sum(n), ref(n) {}
};

TapVerdict check_tap(const ActivationSet& set, const TapData& t, const CompareOptions& opts, std::size_t chunk,
                     const Workers& threads, std::vector<ChunkBuffers>& bufs);

}  // namespace dc
