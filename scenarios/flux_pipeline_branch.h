// One CFG branch's velocity at one step of flux_pipeline, with TeaCache-style
// step caching (flag cache_threshold): written once for the sharded run
// (float) and its reference (double).
//
// Caching: at each step the first block's modulated input (image rows) is
// compared with the previous step's; the relative L1 change
// sum|now - previous| / sum|previous| — summed over the whole sequence-
// parallel group, so every rank of it decides alike — accumulates, and while
// the sum stays below the threshold the blocks are skipped and the residual
// they added at the last computed step is reused. The first and last steps
// always compute.
#pragma once
#include <cmath>
#include <functional>
#include <optional>
#include <vector>

#include "reference/flux_pipeline.h"
#include "reference/ops.h"

namespace dc::flux_pipeline {

template <class T>
struct BranchCache {
  BasicTensor<T> previous;                 // last step's modulated input, image rows
  BasicTensor<T> residual;                 // blocks' output - input at the last computed step
  std::vector<BasicTensor<T>> block_taps;  // that step's block taps, shown again when skipped
  double accumulated = 0;
  bool primed = false;
};

template <class T>
struct BranchStep {
  BasicTensor<T> v;                        // the branch's velocity, image rows [n, C]
  std::vector<BasicTensor<T>> block_taps;  // per block: attention (image rows), output (image rows), output (text rows)
  double rel_l1 = 0;                       // the change this step (0 at the first)
  bool decided = true;                     // this run's own decision: compute the blocks
};

struct BranchOptions {
  double threshold = 0;            // 0: no caching
  bool last_step = false;
  std::optional<bool> follow;      // compute or not as told (the reference follows the sharded run)
  // Sums the change statistic over the sequence-parallel group (in place);
  // empty: this rank's rows only (fault per_rank_cache_decision).
  std::function<void(std::vector<double>&)> reduce;
};

template <class T>
BranchStep<T> branch_step(const BasicTensor<T>& x, const BasicTensor<T>& txt, const BasicTensor<T>& temb,
                          const ref::PipelineWeights<T>& w, const ref::PipelineSizes& z, const ref::RopeTable& rope,
                          const ref::AttendFn<T>& attend, const ref::Round<T>& round, BranchCache<T>& cache,
                          const BranchOptions& opt) {
  const std::size_t text = z.block.txt;
  BasicTensor<T> h0 = ref::embed_tokens(x, txt, w, round);
  BranchStep<T> out;
  bool compute = true;
  if (opt.threshold > 0) {
    const auto mod = ref::flux_modulated_input(h0, temb, w.blocks[0], z.block, round).second;
    BasicTensor<T> now = ref::take_rows(mod, text, mod.shape[0]);
    if (cache.primed && !opt.last_step) {
      std::vector<double> sums{0.0, 0.0};
      for (std::size_t i = 0; i < now.size(); ++i) {
        sums[0] += std::abs(double(now.data[i]) - double(cache.previous.data[i]));
        sums[1] += std::abs(double(cache.previous.data[i]));
      }
      if (opt.reduce) opt.reduce(sums);
      out.rel_l1 = sums[0] / sums[1];
      out.decided = cache.accumulated + out.rel_l1 >= opt.threshold;
      cache.accumulated += out.rel_l1;
    }
    compute = opt.follow.value_or(out.decided);
    if (compute) cache.accumulated = 0;
    cache.previous = std::move(now);
  }
  BasicTensor<T> h;
  if (compute || !cache.primed) {
    const ref::BlockObserver<T> observe = [&](std::size_t, const ref::FluxActivations<T>& a, const BasicTensor<T>& hk) {
      out.block_taps.push_back(ref::take_rows(a.attn, text, a.attn.shape[0]));
      out.block_taps.push_back(ref::take_rows(hk, text, hk.shape[0]));
      out.block_taps.push_back(ref::take_rows(hk, 0, text));
    };
    h = ref::run_blocks(h0, temb, w, z, rope, attend, round, observe);
    cache.residual = BasicTensor<T>(h.shape);
    for (std::size_t i = 0; i < h.size(); ++i) cache.residual.data[i] = h.data[i] - h0.data[i];
    round(cache.residual);
    cache.block_taps = out.block_taps;
    cache.primed = true;
  } else {
    h = BasicTensor<T>(h0.shape);
    for (std::size_t i = 0; i < h.size(); ++i) h.data[i] = h0.data[i] + cache.residual.data[i];
    round(h);
    out.block_taps = cache.block_taps;
  }
  out.v = ref::final_layer(h, text, temb, w, z, round);
  return out;
}

}  // namespace dc::flux_pipeline
