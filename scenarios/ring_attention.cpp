#include "scenarios/ring_attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "harness/core/error.h"
#include "reference/nn.h"
#include "reference/ops.h"
#include "reference/softmax.h"

namespace dc {

namespace {

// Query rows per block of scores: rows x Sk float64 stays in cache between
// the first GEMM, the exp pass and the second GEMM.
constexpr std::size_t kRowBlock = 64;

// The values as float64: float inputs widened once (exactly), float64 ones as they are.
const double* as_double(const BasicTensor<double>& t, std::vector<double>&) { return t.ptr(); }
const double* as_double(const BasicTensor<float>& t, std::vector<double>& copy) {
  copy.assign(t.data.begin(), t.data.end());
  return copy.data();
}

}  // namespace

// Per head, in blocks of query rows: s = q kᵀ, s = exp(s - max) (SLEEF where
// the CPU has AVX2), o = s v / sum — GEMMs on the head-major layout, all in
// float64 whatever T is, as the per-element loop it replaces was.
template <class T>
std::pair<BasicTensor<T>, BasicTensor<T>> block_attention(const BasicTensor<T>& q, const BasicTensor<T>& k,
                                                          const BasicTensor<T>& v) {
  const std::size_t h = q.shape[0], sq = q.shape[1], d = q.shape[2], sk = k.shape[1];
  BasicTensor<T> out({h, sq, d}), lse({h, sq});
  std::vector<double> q_copy, k_copy, v_copy;
  const double *qd = as_double(q, q_copy), *kd = as_double(k, k_copy), *vd = as_double(v, v_copy);
  const std::size_t block = std::min(kRowBlock, sq);
  std::vector<double> s(block * sk), o(block * d), sums(block), maxima(block);
  for (std::size_t a = 0; a < h; ++a) {
    const double *qa = qd + a * sq * d, *ka = kd + a * sk * d, *va = vd + a * sk * d;
    for (std::size_t i0 = 0; i0 < sq; i0 += kRowBlock) {
      const std::size_t rows = std::min(kRowBlock, sq - i0);
      ref::gemm_strided<double>(true, rows, sk, d, qa + i0 * d, d, ka, d, s.data(), sk);
      for (std::size_t i = 0; i < rows; ++i)  // the max exp_rows subtracts, for the LSE
        maxima[i] = sk ? *std::max_element(s.begin() + static_cast<std::ptrdiff_t>(i * sk),
                                           s.begin() + static_cast<std::ptrdiff_t>((i + 1) * sk))
                       : -INFINITY;
      ref::exp_rows(s.data(), rows, sk, 1.0, sums.data());
      ref::gemm_strided<double>(false, rows, d, sk, s.data(), sk, va, d, o.data(), d);
      for (std::size_t i = 0; i < rows; ++i) {
        T* out_row = out.ptr() + (a * sq + i0 + i) * d;
        for (std::size_t x = 0; x < d; ++x) out_row[x] = static_cast<T>(o[i * d + x] / sums[i]);
        lse.data[a * sq + i0 + i] = static_cast<T>(maxima[i] + std::log(sums[i]));
      }
    }
  }
  return {std::move(out), std::move(lse)};
}

template std::pair<Tensor, Tensor> block_attention(const Tensor&, const Tensor&, const Tensor&);
template std::pair<RefTensor, RefTensor> block_attention(const RefTensor&, const RefTensor&, const RefTensor&);

namespace {
double log_sigmoid(double x) { return x < 0 ? x - std::log1p(std::exp(x)) : -std::log1p(std::exp(-x)); }
}  // namespace

template <class T>
void lse_merge(BasicTensor<T>& out, BasicTensor<T>& lse, const BasicTensor<T>& ob, const BasicTensor<T>& lb,
               bool sigmoid_form) {
  const std::size_t h = out.shape[0], sq = out.shape[1], d = out.shape[2];
  for (std::size_t i = 0; i < sq; ++i)
    for (std::size_t a = 0; a < h; ++a) {
      const double l = lse.data[i * h + a], b = lb.data[i * h + a];
      T* o = out.ptr() + (a * sq + i) * d;
      const T* ob_row = ob.ptr() + (a * sq + i) * d;
      if (sigmoid_form) {
        const double w = 1.0 / (1.0 + std::exp(l - b));  // sigmoid(b - l)
        for (std::size_t x = 0; x < d; ++x) o[x] = static_cast<T>(o[x] - w * (double(o[x]) - ob_row[x]));
        lse.data[i * h + a] = static_cast<T>(l - log_sigmoid(l - b));
      } else {
        const double m = std::max(l, b), p = std::exp(l - m), c = std::exp(b - m);
        for (std::size_t x = 0; x < d; ++x) o[x] = static_cast<T>((p * o[x] + c * ob_row[x]) / (p + c));
        lse.data[i * h + a] = static_cast<T>(m + std::log(p + c));
      }
    }
}

template void lse_merge(Tensor&, Tensor&, const Tensor&, const Tensor&, bool);
template void lse_merge(RefTensor&, RefTensor&, const RefTensor&, const RefTensor&, bool);

std::pair<Tensor, Tensor> ring_attention(const Comm& ring, const Tensor& q, const Tensor& k, const Tensor& v,
                                         const RingOptions& opt, const RingObserver& observe) {
  const std::size_t n = static_cast<std::size_t>(ring.size()), me = static_cast<std::size_t>(ring.rank());
  const std::size_t h = q.shape[0], sq = q.shape[1], d = q.shape[2], sk = k.shape[1], kv_n = k.size();
  std::array<std::vector<float>, 2> buf;
  buf[0].reserve(2 * kv_n);
  buf[0].insert(buf[0].end(), k.data.begin(), k.data.end());
  buf[0].insert(buf[0].end(), v.data.begin(), v.data.end());
  buf[1].assign(2 * kv_n, 0.0f);
  std::vector<float> all;  // kv_transfer=allgather: every ring rank's block, in ring order
  if (opt.allgather) all = ring.all_gather(std::span<const float>(buf[0]));
  std::size_t cur = 0;
  Tensor out, lse;  // the merge state: out [h, Sq, D], lse token-major [Sq, h]
  for (std::size_t t = 0; t < n; ++t) {
    const bool more = !opt.allgather && t + 1 < n;
    Request next;
    const float* block = buf[cur].data();
    if (opt.allgather) {
      block = all.data() + ((me + n - t) % n) * 2 * kv_n;
    } else if (more && opt.overlap) {
      next = ring.iring_shift(std::span<const float>(buf[cur]), std::span<float>(buf[1 - cur]));
      // The fault: the incoming block is received into the buffer this step
      // still reads; deterministically, as if it landed before the read.
      if (opt.fault_kv_reuse) {
        next.wait();
        block = buf[1 - cur].data();
      }
    }
    const Tensor kb({h, sk, d}, std::vector<float>(block, block + kv_n));
    const Tensor vb({h, sk, d}, std::vector<float>(block + kv_n, block + 2 * kv_n));
    auto [ob, lb] = block_attention(q, kb, vb);  // lb head-major [h, Sq]
    round_to(opt.dtype, ob.data);
    if (opt.fault_lse_offset) {
      // Smoothing: k - mean(k over the block) leaves the softmax (and ob)
      // unchanged and lowers every logit of query i by q_i . mean(k); the
      // kernel never adds that back into its LSE.
      for (std::size_t a = 0; a < h; ++a) {
        std::vector<double> mean(d, 0.0);
        for (std::size_t j = 0; j < sk; ++j)
          for (std::size_t x = 0; x < d; ++x) mean[x] += kb.data[(a * sk + j) * d + x] / double(sk);
        for (std::size_t i = 0; i < sq; ++i) {
          double off = 0;
          for (std::size_t x = 0; x < d; ++x) off += double(q.data[(a * sq + i) * d + x]) * mean[x];
          lb.data[a * sq + i] = static_cast<float>(lb.data[a * sq + i] - opt.fault_lse_scale * off);
        }
      }
    }
    // The hand-over: the merge reads [Sq, h]; the faulty kernel gives [h, Sq].
    const Tensor handed = opt.fault_lse_layout ? lb : ref::transpose2(lb);
    // The code under test crashes here; every rank alike (the shapes are the
    // same on all), so it is one finding and a clean end, not an abort.
    if (handed.shape != Shape{sq, h})
      throw Finding(fmt::format("CRASH on every rank: ring attention merge (step {}): the kernel's LSE has shape {} "
                                "where the merge reads [Sq, heads] = [{}, {}]",
                                t, shape_str(handed.shape), sq, h),
                    true);
    if (t == 0) {
      out = std::move(ob);
      lse = handed;
    } else {
      lse_merge(out, lse, ob, handed, opt.sigmoid_merge);
      round_to(opt.dtype, out.data);
    }
    if (more) {
      if (opt.overlap) next.wait();
      else ring.ring_shift(std::span<const float>(buf[cur]), std::span<float>(buf[1 - cur]));
      cur = 1 - cur;
    }
    if (observe) observe(t, out, ref::transpose2(lse));
  }
  return {out, ref::transpose2(lse)};
}

}  // namespace dc
