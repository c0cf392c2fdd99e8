#include "scenarios/ulysses_attention.h"

#include <algorithm>
#include <array>
#include <limits>

#include "harness/core/error.h"
#include "reference/flash_attention.h"

namespace dc {

std::vector<HeadChunk> ulysses_head_chunks(std::size_t heads, std::size_t shards, std::size_t chunks) {
  if (shards == 0 || heads % shards != 0)
    input_error("Ulysses attention needs heads % sp == 0 (heads {}, sp {})", heads, shards);
  if (chunks < 1) input_error("ulysses_chunks must be >= 1 (got {})", chunks);
  const std::size_t groups = heads / shards, n = std::min(chunks, groups);
  const std::size_t base = std::max<std::size_t>(1, groups / n);
  std::vector<HeadChunk> out;
  for (std::size_t k = 0; k < n; ++k)
    out.push_back({k * base * shards, (k + 1 == n ? groups : (k + 1) * base) * shards});
  return out;
}

namespace {

// One all-to-all in flight: its buffers must outlive the request.
struct Transfer {
  std::vector<float> send, recv, as_posted;
  Request req;
};

class Pipeline {
 public:
  Pipeline(const Comm& sp, const Tensor& q, const Tensor& k, const Tensor& v, const UlyssesOptions& opt,
           const ChunkObserver& observe)
      : sp_(sp), in_{&q, &k, &v}, opt_(opt), observe_(observe),
        chunks_(ulysses_head_chunks(q.shape[1], static_cast<std::size_t>(sp.size()), opt.chunks)),
        p_(static_cast<std::size_t>(sp.size())), sl_(q.shape[0]), h_(q.shape[1]), d_(q.shape[2]),
        out_({sl_, h_, d_}),
        armed_(opt.async && opt.overlap),
        read_before_wait_(armed_ && opt.fault_read_before_wait),
        send_reuse_(armed_ && opt.fault_send_reuse) {}

  Tensor run() {
    const std::size_t n = chunks_.size();
    if (!opt_.overlap) {
      for (std::size_t c = 0; c < n; ++c) {
        post_first(c);
        wait(first_[slot(c)]);
        compute(c);
        post_second(c);
        finish_second(c);
      }
      return out_;
    }
    post_first(0);
    for (std::size_t c = 0; c < n; ++c) {
      if (c + 1 < n) post_first(c + 1);
      if (!read_before_wait_) wait(first_[slot(c)]);
      compute(c);
      if (read_before_wait_) wait(first_[slot(c)]);
      if (c > 0) finish_second(c - 1);
      post_second(c);
    }
    finish_second(n - 1);
    return out_;
  }

 private:
  std::size_t slot(std::size_t c) const { return opt_.overlap ? c % 2 : 0; }
  std::size_t per_rank(std::size_t c) const { return (chunks_[c].end - chunks_[c].begin) / p_; }

  // Send buffer of all-to-all #1 for tensor t: block r = heads of rank r of
  // chunk c, all local tokens: [S/P, hp, D].
  std::vector<float> pack_first(std::size_t c, std::size_t t) const {
    const std::size_t hp = per_rank(c);
    std::vector<float> buf;
    buf.reserve(p_ * sl_ * hp * d_);
    for (std::size_t r = 0; r < p_; ++r)
      for (std::size_t s = 0; s < sl_; ++s) {
        const float* row = in_[t]->ptr() + (s * h_ + chunks_[c].begin + r * hp) * d_;
        buf.insert(buf.end(), row, row + hp * d_);
      }
    return buf;
  }

  // Fused: block r holds q, k, v blocks in turn.
  std::vector<float> pack_first_fused(std::size_t c) const {
    std::array<std::vector<float>, 3> parts{pack_first(c, 0), pack_first(c, 1), pack_first(c, 2)};
    const std::size_t block = parts[0].size() / p_;
    std::vector<float> buf;
    buf.reserve(3 * parts[0].size());
    for (std::size_t r = 0; r < p_; ++r)
      for (const auto& part : parts) buf.insert(buf.end(), part.begin() + r * block, part.begin() + (r + 1) * block);
    return buf;
  }

  void post(Transfer& tr, std::vector<float> send) {
    tr.send = std::move(send);
    tr.recv.assign(tr.send.size(), read_before_wait_ ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
    // What a read before the wait sees, deterministically: the poisoned buffer,
    // before MPI may have delivered any block (even this rank's own).
    if (read_before_wait_) tr.as_posted = tr.recv;
    if (opt_.async) {
      tr.req = sp_.iall_to_all(std::span<const float>(tr.send), std::span<float>(tr.recv));
    } else {
      sp_.all_to_all(std::span<const float>(tr.send), std::span<float>(tr.recv));
    }
  }

  void post_first(std::size_t c) {
    auto& trs = first_[slot(c)];
    trs.resize(opt_.fused ? 1 : 3);
    for (std::size_t t = 0; t < trs.size(); ++t) {
      auto send = opt_.fused ? pack_first_fused(c) : pack_first(c, t);
      if (send_reuse_ && c + 1 < chunks_.size()) {
        // The next chunk is packed into the shared send buffer before this one
        // is sent: this chunk carries the next chunk's heads.
        auto next = opt_.fused ? pack_first_fused(c + 1) : pack_first(c + 1, t);
        std::copy(next.begin(), next.begin() + std::min(next.size(), send.size()), send.begin());
      }
      post(trs[t], std::move(send));
    }
  }

  static void wait(std::vector<Transfer>& trs) {
    for (auto& tr : trs) tr.req.wait();
  }

  // Received blocks -> head-major [hp, S, D] for q, k, v.
  std::array<Tensor, 3> unpack_first(std::size_t c) {
    const std::size_t hp = per_rank(c), s_all = sl_ * p_, block = sl_ * hp * d_;
    std::array<Tensor, 3> qkv{Tensor({hp, s_all, d_}), Tensor({hp, s_all, d_}), Tensor({hp, s_all, d_})};
    auto& trs = first_[slot(c)];
    for (std::size_t t = 0; t < 3; ++t) {
      const auto& tr = opt_.fused ? trs[0] : trs[t];
      const auto& src = read_before_wait_ ? tr.as_posted : tr.recv;
      for (std::size_t i = 0; i < p_; ++i) {
        const float* b = src.data() + (opt_.fused ? (3 * i + t) : i) * block;
        for (std::size_t s = 0; s < sl_; ++s)
          for (std::size_t h = 0; h < hp; ++h)
            std::copy(b + (s * hp + h) * d_, b + (s * hp + h + 1) * d_,
                      qkv[t].ptr() + (h * s_all + i * sl_ + s) * d_);
      }
    }
    return qkv;
  }

  void compute(std::size_t c) {
    auto [q, k, v] = unpack_first(c);
    attn_[slot(c)] = opt_.attend ? opt_.attend(c, q, k, v) : ref::flash_attention(q, k, v, opt_.flash_block, opt_.flash_block);
    round_to(opt_.dtype, attn_[slot(c)].data);
    if (observe_) observe_(c, chunks_[c], q, k, v, attn_[slot(c)]);
  }

  // All-to-all #2: block i = this rank's heads for rank i's tokens: [hp, S/P, D].
  void post_second(std::size_t c) {
    const Tensor& o = attn_[slot(c)];
    const std::size_t hp = per_rank(c), s_all = sl_ * p_;
    std::vector<float> send;
    send.reserve(o.size());
    for (std::size_t i = 0; i < p_; ++i)
      for (std::size_t h = 0; h < hp; ++h)
        send.insert(send.end(), o.ptr() + (h * s_all + i * sl_) * d_, o.ptr() + (h * s_all + (i + 1) * sl_) * d_);
    second_[slot(c)].resize(1);
    post(second_[slot(c)][0], std::move(send));
  }

  void finish_second(std::size_t c) {
    auto& tr = second_[slot(c)][0];
    tr.req.wait();
    const std::size_t hp = per_rank(c);
    for (std::size_t j = 0; j < p_; ++j)
      for (std::size_t h = 0; h < hp; ++h)
        for (std::size_t s = 0; s < sl_; ++s) {
          const float* src = tr.recv.data() + ((j * hp + h) * sl_ + s) * d_;
          std::copy(src, src + d_, out_.ptr() + (s * h_ + chunks_[c].begin + j * hp + h) * d_);
        }
  }

  const Comm& sp_;
  std::array<const Tensor*, 3> in_;
  UlyssesOptions opt_;
  const ChunkObserver& observe_;
  std::vector<HeadChunk> chunks_;
  std::size_t p_, sl_, h_, d_;
  Tensor out_;
  bool armed_, read_before_wait_, send_reuse_;
  std::array<std::vector<Transfer>, 2> first_, second_;
  std::array<Tensor, 2> attn_;
};

}  // namespace

Tensor ulysses_attention(const Comm& sp, const Tensor& q, const Tensor& k, const Tensor& v,
                         const UlyssesOptions& opt, const ChunkObserver& observe) {
  if (q.rank() != 3 || q.shape != k.shape || q.shape != v.shape)
    fail("ulysses_attention: q {} k {} v {} must be equal [S/P, H, D]", shape_str(q.shape),
         shape_str(k.shape), shape_str(v.shape));
  return Pipeline(sp, q, k, v, opt, observe).run();
}

}  // namespace dc
