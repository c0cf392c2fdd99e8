#include "harness/capture/recorded.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "harness/core/error.h"

namespace dc {
namespace {

// A box of a tensor placed in global coordinates.
struct Box {
  Shape start, count;
};

std::size_t box_size(const Box& b) { return numel(b.count); }

// The intersection of two boxes; count 0 along some dimension when disjoint.
Box intersect(const Box& a, const Box& b) {
  Box r{a.start, a.count};
  for (std::size_t d = 0; d < a.start.size(); ++d) {
    const std::size_t lo = std::max(a.start[d], b.start[d]);
    const std::size_t hi = std::min(a.start[d] + a.count[d], b.start[d] + b.count[d]);
    r.start[d] = lo;
    r.count[d] = hi > lo ? hi - lo : 0;
  }
  return r;
}

// Copies `region` (inside both boxes) from `src`, a row-major array covering
// box `from`, into `dst`, a row-major array covering box `to`.
template <class S>
void copy_region(const S* src, const Box& from, double* dst, const Box& to, const Box& region) {
  const std::size_t n = box_size(region), nd = region.start.size();
  if (n == 0) return;
  if (nd == 0) {
    dst[0] = static_cast<double>(src[0]);
    return;
  }
  const auto sf = strides_of(from.count), st = strides_of(to.count);
  const std::size_t row = region.count[nd - 1];
  std::vector<std::size_t> idx(nd, 0);
  for (std::size_t done = 0; done < n; done += row) {
    std::size_t a = 0, b = 0;
    for (std::size_t d = 0; d < nd; ++d) {
      const std::size_t g = region.start[d] + idx[d];
      a += (g - from.start[d]) * sf[d];
      b += (g - to.start[d]) * st[d];
    }
    for (std::size_t i = 0; i < row; ++i) dst[b + i] = static_cast<double>(src[a + i]);
    for (std::size_t d = nd - 1; d-- > 0;) {
      if (++idx[d] < region.count[d]) break;
      idx[d] = 0;
    }
  }
}

// 128 bits over a piece's bytes: two independent multiply-mix lanes. Equal
// hashes are taken as equal bits (a replica's values are then not sent).
std::pair<std::uint64_t, std::uint64_t> piece_hash(const Tensor& t) {
  std::uint64_t h1 = 0x9e3779b97f4a7c15ULL ^ t.size(), h2 = 0xc2b2ae3d27d4eb4fULL + t.size();
  const auto* bytes = reinterpret_cast<const unsigned char*>(t.ptr());
  const std::size_t n = t.size() * sizeof(float);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, bytes + i, 8);
    h1 = (h1 ^ w) * 0x100000001b3ULL;
    h1 ^= h1 >> 29;
    h2 = (h2 + w) * 0xff51afd7ed558ccdULL;
    h2 ^= h2 >> 31;
  }
  for (; i < n; ++i) {
    h1 = (h1 ^ bytes[i]) * 0x100000001b3ULL;
    h2 = (h2 + bytes[i]) * 0xff51afd7ed558ccdULL;
  }
  return {h1, h2};
}

class RecordedData final : public ActivationData {
 public:
  RecordedData(const Comm& world, const TapRecorder& taps) : world_(world), taps_(taps) {
    const auto& records = taps.records();
    // Every rank's piece hashes, to know which replicas equal their leader.
    std::vector<std::uint64_t> mine;
    for (const auto& r : records) {
      auto [a, b] = piece_hash(r.local);
      mine.push_back(a);
      mine.push_back(b);
    }
    stride_ = mine.size();
    const std::string bytes(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(std::uint64_t));
    for (const auto& theirs : world.all_gather_strings(bytes)) {
      if (theirs.size() != bytes.size())
        fail("rank {}: in-run check: another rank recorded {} taps, this one {}", world.rank(),
             theirs.size() / 16, records.size());
      const std::size_t at = hashes_.size();
      hashes_.resize(at + stride_);
      std::memcpy(hashes_.data() + at, theirs.data(), theirs.size());
    }
    for (const auto& [name, held] : all_reference_boxes(world, taps))
      for (const auto& h : held) boxes_[name].push_back({h.rank, Box{h.start, h.shape}});
  }

  const Comm* holders() const override { return &world_; }

  int reference_holder(const TapData& t, const Slab& slab) const override {
    const Box first{slab.start, Shape(slab.start.size(), 1)};
    for (const auto& b : boxes_of(t))
      if (box_size(intersect(b.box, first)) == 1 || slab.start.empty()) return b.holder;
    return 0;
  }

  void stage(const TapData& t, const std::vector<PlannedRead>& reads) const override {
    const int me = world_.rank(), P = world_.size();
    std::lock_guard<std::mutex> lock(mu_);
    staged_.clear();
    const TapRecord& rec = record(t);
    // Every transfer of the round in one order all ranks agree on: (reader,
    // source rank or -1, slab), first appearance, duplicates dropped.
    std::vector<std::tuple<int, int, Box>> transfers;
    std::map<std::tuple<int, int, Shape, Shape>, bool> seen;
    for (const auto& r : reads) {
      const int src = r.rank < 0 ? -1 : source_of(t, r.rank);
      // Read straight from the reader's own memory: its piece, the leader's
      // piece it stands in for, or a reference slab inside one of its boxes.
      if (src == r.reader || (src < 0 && holds_whole(t, r.reader, Box{r.slab.start, r.slab.count}))) continue;
      if (seen.emplace(std::make_tuple(r.reader, src, r.slab.start, r.slab.count), true).second)
        transfers.emplace_back(r.reader, src, Box{r.slab.start, r.slab.count});
    }
    std::vector<std::vector<double>> out(static_cast<std::size_t>(P));
    for (const auto& [reader, src, box] : transfers) {
      if (src >= 0) {
        if (src != me) continue;
        auto& o = out[static_cast<std::size_t>(reader)];
        const std::size_t at = o.size();
        o.resize(at + box_size(box));
        copy_region(rec.local.ptr(), Box{Shape(box.start.size(), 0), rec.local.shape}, o.data() + at, box, box);
        continue;
      }
      for (const auto& b : boxes_of(t)) {  // the reference: every holder sends its part
        const Box part = intersect(b.box, box);
        if (b.holder != me || box_size(part) == 0 || b.holder == reader) continue;
        auto& o = out[static_cast<std::size_t>(reader)];
        const std::size_t at = o.size();
        o.resize(at + box_size(part));
        copy_region(local_box(t, b.box).ptr(), b.box, o.data() + at, part, part);
      }
    }
    // What this rank receives is known from the transfers: point to point
    // between the pairs that move something, no collective.
    std::vector<std::size_t> from(static_cast<std::size_t>(P), 0);
    for (const auto& [reader, src, box] : transfers) {
      if (reader != me) continue;
      if (src >= 0) {
        from[static_cast<std::size_t>(src)] += box_size(box);
        continue;
      }
      for (const auto& b : boxes_of(t))
        if (b.holder != me) from[static_cast<std::size_t>(b.holder)] += box_size(intersect(b.box, box));
    }
    const auto in = world_.exchange_known(out, from);
    std::vector<std::size_t> at(static_cast<std::size_t>(P), 0);
    for (const auto& [reader, src, box] : transfers) {
      if (reader != me) continue;
      auto& buf = staged_[key(src, box)];
      buf.assign(box_size(box), 0.0);
      if (src >= 0) {
        const auto& from = in[static_cast<std::size_t>(src)];
        std::copy_n(from.begin() + static_cast<std::ptrdiff_t>(at[static_cast<std::size_t>(src)]), buf.size(), buf.begin());
        at[static_cast<std::size_t>(src)] += buf.size();
        continue;
      }
      for (const auto& b : boxes_of(t)) {
        const Box part = intersect(b.box, box);
        if (box_size(part) == 0) continue;
        if (b.holder == me) {
          copy_region(local_box(t, b.box).ptr(), b.box, buf.data(), box, part);
          continue;
        }
        const auto h = static_cast<std::size_t>(b.holder);
        copy_region(in[h].data() + at[h], part, buf.data(), box, part);
        at[h] += box_size(part);
      }
    }
  }

  void read_piece(const TapData& t, int rank, const Slab& slab, double* out) const override {
    const int src = source_of(t, rank);
    if (src == world_.rank()) {
      const Tensor& local = record(t).local;
      copy_region(local.ptr(), Box{Shape(slab.start.size(), 0), local.shape}, out, Box{slab.start, slab.count},
                  Box{slab.start, slab.count});
      return;
    }
    copy_staged(src, slab, out, fmt::format("tap '{}' of rank {}", t.name, rank));
  }

  void read_reference(const TapData& t, const Slab& slab, double* out) const override {
    // A slab held whole by this rank is read in place; anything else was staged.
    const Box want{slab.start, slab.count};
    if (const Placed* b = whole_box(t, world_.rank(), want)) {
      copy_region(local_box(t, b->box).ptr(), b->box, out, want, want);
      return;
    }
    copy_staged(-1, slab, out, fmt::format("reference of tap '{}'", t.name));
  }

 private:
  struct Placed {
    int holder;
    Box box;
  };

  const TapRecord& record(const TapData& t) const { return taps_.records().at(t.data_id); }

  const std::vector<Placed>& boxes_of(const TapData& t) const {
    static const std::vector<Placed> none;
    auto it = boxes_.find(t.name);
    return it == boxes_.end() ? none : it->second;
  }

  // A box of `holder`'s that contains all of `want`, or null.
  const Placed* whole_box(const TapData& t, int holder, const Box& want) const {
    for (const auto& b : boxes_of(t))
      if (b.holder == holder && box_size(intersect(b.box, want)) == box_size(want)) return &b;
    return nullptr;
  }
  bool holds_whole(const TapData& t, int holder, const Box& want) const {
    return whole_box(t, holder, want) != nullptr;
  }

  // This rank's box of a reference that starts at `box.start`.
  const RefTensor& local_box(const TapData& t, const Box& box) const {
    for (const auto& b : taps_.references().at(t.name).blocks)
      if (b.start == box.start) return b.data;
    fail("rank {}: no reference box of tap '{}' at [{}]", world_.rank(), t.name, fmt::join(box.start, ","));
  }

  // Whose memory serves rank `rank`'s piece: its replica leader's when their
  // hashes agree (the values are bit-identical), else its own.
  int source_of(const TapData& t, int rank) const {
    const int leader = record(t).opts.layout.replica_leader(taps_.mesh(), rank);
    if (leader == rank) return rank;
    const std::size_t i = t.data_id * 2;
    const auto h = [&](int r) {
      const std::size_t at = static_cast<std::size_t>(r) * stride_ + i;
      return std::make_pair(hashes_[at], hashes_[at + 1]);
    };
    return h(leader) == h(rank) ? leader : rank;
  }

  static std::string key(int src, const Box& box) {
    return fmt::format("{}|{}|{}", src, fmt::join(box.start, ","), fmt::join(box.count, ","));
  }

  // Reads come after stage() returns, never during (the checker's rounds), so
  // the staged buffers are only read here.
  void copy_staged(int src, const Slab& slab, double* out, const std::string& what) const {
    auto it = staged_.find(key(src, Box{slab.start, slab.count}));
    if (it == staged_.end())
      fail("rank {}: in-run check read {} [{}] +[{}], which was not staged for it", world_.rank(), what,
           fmt::join(slab.start, ","), fmt::join(slab.count, ","));
    std::copy(it->second.begin(), it->second.end(), out);
  }

  const Comm& world_;
  const TapRecorder& taps_;
  std::vector<std::uint64_t> hashes_;  // [rank][tap][2]
  std::size_t stride_ = 0;
  std::map<std::string, std::vector<Placed>> boxes_;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::vector<double>> staged_;
};

}  // namespace

ActivationSet recorded_activations(const Comm& world, const TapRecorder& taps, const RunInfo& info,
                                   const std::string& source) {
  ActivationSet set;
  set.source = source;
  set.mesh = taps.mesh();
  set.world_size = world.size();
  // The root attributes the run file carries, as its reader gives them.
  set.info = {{"scenario", info.scenario}, {"flags", info.flags}, {"dtype", info.dtype},
              {"producer", info.producer}, {"seed", std::to_string(info.seed)}};
  if (!info.size.empty()) set.info["size"] = info.size;
  // Reference shapes: every rank's boxes declare their tap's global shape.
  std::string mine;
  for (const auto& [name, part] : taps.references())
    mine += fmt::format("{}\t{}\n", name, fmt::join(part.global, ","));
  std::map<std::string, Shape> reference_shapes;
  for (const auto& lines : world.all_gather_strings(mine)) {
    std::stringstream ss(lines);
    for (std::string line; std::getline(ss, line);) {
      const auto tab = line.find('\t');
      Shape s;
      std::stringstream ds(line.substr(tab + 1));
      for (std::string d; std::getline(ds, d, ',');) s.push_back(std::stoull(d));
      reference_shapes.emplace(line.substr(0, tab), s);
    }
  }
  const auto& records = taps.records();
  for (std::size_t i = 0; i < records.size(); ++i) {
    const auto& r = records[i];
    TapData t;
    t.name = r.name;
    t.layout = r.opts.layout;
    t.order = r.order;
    t.visit_index = static_cast<long>(i);
    t.dtype = taps.dtype() == DType::bfloat16 ? "bfloat16" : "float32";
    t.stored = StoredKind::float32;  // as the run file stores it
    t.atol = r.opts.atol;
    t.rtol = r.opts.rtol;
    if (r.opts.reduction_depth > 0) t.reduction_depth = r.opts.reduction_depth;
    if (r.opts.tolerance_factor != 1.0) t.tolerance_factor = r.opts.tolerance_factor;
    t.image = r.opts.image;
    t.per_mesh = r.opts.per_mesh;
    t.microbatches = r.opts.microbatches;
    t.local_shape = r.local.shape;
    if (auto it = reference_shapes.find(r.name); it != reference_shapes.end()) t.reference_shape = it->second;
    t.data_id = i;
    set.taps.push_back(std::move(t));
  }
  // The file's reader orders taps by their `order` attribute, as here.
  std::stable_sort(set.taps.begin(), set.taps.end(),
                   [](const TapData& a, const TapData& b) { return *a.order < *b.order; });
  set.data = std::make_shared<RecordedData>(world, taps);
  return set;
}

}  // namespace dc
