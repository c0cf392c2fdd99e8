#include "harness/check/tap_stats.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <type_traits>

#include "harness/core/error.h"

namespace dc {
namespace {

template <class T>
void keep_first(std::optional<T>& mine, const std::optional<T>& other) {
  if (other && (!mine || *other < *mine)) mine = other;
}

void append(std::vector<int>& a, const std::vector<int>& b) { a.insert(a.end(), b.begin(), b.end()); }

void sort_unique(std::vector<int>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

template <class T>
void append(std::vector<T>& a, const std::vector<T>& b) {
  a.insert(a.end(), b.begin(), b.end());
}

// One entry per rank, in rank order: summed or the maximum.
void combine_by_rank(std::vector<RankValue>& v, bool sum) {
  std::stable_sort(v.begin(), v.end());
  std::vector<RankValue> out;
  for (const auto& x : v) {
    if (!out.empty() && out.back().rank == x.rank) {
      auto& y = out.back().value;
      y = sum ? y + x.value : (std::isnan(x.value) || x.value > y ? x.value : y);
    } else {
      out.push_back(x);
    }
  }
  v = std::move(out);
}

// Plain bytes of trivially copyable values, in a fixed field order.
struct Writer {
  std::string out;
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  template <class T>
  void put(const std::optional<T>& v) {
    put(v.has_value());
    if (v) put(*v);
  }
  void put(const std::pair<int, std::size_t>& v) {
    put(v.first);
    put(v.second);
  }
  template <class T>
  void put(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    put(v.size());
    out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
};

struct Reader {
  const std::string& in;
  std::size_t at = 0;
  void need(std::size_t n) {
    if (at + n > in.size()) fail("comparator: truncated statistics from another process");
  }
  template <class T>
  void get(T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    std::memcpy(&v, in.data() + at, sizeof(T));
    at += sizeof(T);
  }
  template <class T>
  void get(std::optional<T>& v) {
    bool has = false;
    get(has);
    v.reset();
    if (has) {
      v = T{};
      get(*v);
    }
  }
  void get(std::pair<int, std::size_t>& v) {
    get(v.first);
    get(v.second);
  }
  template <class T>
  void get(std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    std::size_t n = 0;
    get(n);
    if (n > (in.size() - at) / sizeof(T)) fail("comparator: truncated statistics from another process");
    v.resize(n);
    std::memcpy(static_cast<void*>(v.data()), in.data() + at, n * sizeof(T));
    at += n * sizeof(T);
  }
};

template <class Stats, class IO>
void fields(Stats& s, IO& io) {
  io.put_or_get(s.nan), io.put_or_get(s.inf), io.put_or_get(s.first_nan),
      io.put_or_get(s.first_inf), io.put_or_get(s.nonfinite_ranks),
      io.put_or_get(s.replica_worst), io.put_or_get(s.max_ulp), io.put_or_get(s.differing),
      io.put_or_get(s.n_fail), io.put_or_get(s.n_total), io.put_or_get(s.any_nan_error),
      io.put_or_get(s.max_abs), io.put_or_get(s.max_rel), io.put_or_get(s.err_sq),
      io.put_or_get(s.ref_sq), io.put_or_get(s.ref_worst), io.put_or_get(s.rank_nonfinite),
      io.put_or_get(s.rank_replica_diff), io.put_or_get(s.owner_err_ratio), io.put_or_get(s.column_err),
      io.put_or_get(s.owner_err_sq), io.put_or_get(s.owner_ref_sq);
}

struct Encode : Writer {
  template <class T>
  void put_or_get(const T& v) { put(v); }
};
struct Decode : Reader {
  template <class T>
  void put_or_get(T& v) { get(v); }
};

}  // namespace

std::string TapStats::encode() const {
  Encode e;
  fields(*this, e);
  return e.out;
}

TapStats TapStats::decode(const std::string& bytes) {
  TapStats s;
  Decode d{{bytes}};
  fields(s, d);
  if (d.at != bytes.size()) fail("comparator: malformed statistics from another process");
  return s;
}

void TapStats::offer_replica(const ReplicaWorst& w) {
  if (!replica_worst ||
      std::make_tuple(-w.key, w.rank, w.flat) <
          std::make_tuple(-replica_worst->key, replica_worst->rank, replica_worst->flat))
    replica_worst = w;
}

void TapStats::offer_reference(const RefWorst& w) {
  if (!ref_worst || std::make_tuple(-w.ratio, w.global_flat) <
                        std::make_tuple(-ref_worst->ratio, ref_worst->global_flat))
    ref_worst = w;
}

void TapStats::merge(const TapStats& o) {
  nan += o.nan;
  inf += o.inf;
  keep_first(first_nan, o.first_nan);
  keep_first(first_inf, o.first_inf);
  append(nonfinite_ranks, o.nonfinite_ranks);
  if (o.replica_worst) offer_replica(*o.replica_worst);
  max_ulp = std::max(max_ulp, o.max_ulp);
  append(differing, o.differing);
  n_fail += o.n_fail;
  n_total += o.n_total;
  any_nan_error = any_nan_error || o.any_nan_error;
  max_abs = std::max(max_abs, o.max_abs);
  max_rel = std::max(max_rel, o.max_rel);
  err_sq.add(o.err_sq);
  ref_sq.add(o.ref_sq);
  if (o.ref_worst) offer_reference(*o.ref_worst);
  if (column_err.empty()) {
    column_err = o.column_err;
  } else if (!o.column_err.empty()) {
    if (o.column_err.size() != column_err.size()) fail("comparator: column sums of different sizes to merge");
    for (std::size_t c = 0; c < column_err.size(); ++c) column_err[c].add(o.column_err[c]);
  }
  append(rank_nonfinite, o.rank_nonfinite);
  append(rank_replica_diff, o.rank_replica_diff);
  append(owner_err_ratio, o.owner_err_ratio);
  append(owner_err_sq, o.owner_err_sq);
  append(owner_ref_sq, o.owner_ref_sq);
}

void TapStats::finish() {
  sort_unique(nonfinite_ranks);
  sort_unique(differing);
  combine_by_rank(rank_nonfinite, true);
  combine_by_rank(rank_replica_diff, false);
  combine_by_rank(owner_err_ratio, false);
  combine_by_rank(owner_err_sq, true);
  combine_by_rank(owner_ref_sq, true);
}

}  // namespace dc
