#include "scenarios/halo_exchange.h"

#include <algorithm>

#include "harness/core/error.h"
#include "reference/vae_decoder.h"

namespace dc::vae {
namespace {

// Rows (or columns) of a tile of extent n that a piece in direction step s
// covers: the last one for s = -1 (the sender is before the receiver), the
// first for s = +1, all for s = 0.
std::pair<std::size_t, std::size_t> span_of(int s, std::size_t n) {
  if (s < 0) return {n - 1, n};
  if (s > 0) return {0, 1};
  return {0, n};
}

// Where in the padded tile (extent n + 2) a halo from direction step s goes.
std::size_t halo_start(int s, std::size_t n) { return s < 0 ? 0 : s > 0 ? n + 1 : 1; }

bool is_corner(std::size_t d) { return kNeighbours[d].first != 0 && kNeighbours[d].second != 0; }

}  // namespace

TilePlace TilePlace::of(const Mesh& mesh, int rank) {
  if (mesh.axis_index("ph") < 0 || mesh.axis_index("pw") < 0)
    input_error("a patch-parallel tile needs the mesh axes ph and pw, got {}", mesh.str());
  return {mesh.axis_size("ph"), mesh.axis_size("pw"), mesh.index_in(rank, {"ph"}), mesh.index_in(rank, {"pw"})};
}

std::vector<float> border_piece(const Tensor& x, std::size_t d) {
  const std::size_t planes = x.shape[0] * x.shape[1], h = x.shape[2], w = x.shape[3];
  const auto [r0, r1] = span_of(kNeighbours[d].first, h);
  const auto [c0, c1] = span_of(kNeighbours[d].second, w);
  std::vector<float> piece;
  piece.reserve(planes * (r1 - r0) * (c1 - c0));
  for (std::size_t p = 0; p < planes; ++p)
    for (std::size_t i = r0; i < r1; ++i) {
      const float* row = x.data.data() + (p * h + i) * w;
      piece.insert(piece.end(), row + c0, row + c1);
    }
  return piece;
}

void place_halo(Tensor& padded, std::size_t d, const std::vector<float>& piece) {
  const std::size_t planes = padded.shape[0] * padded.shape[1], hp = padded.shape[2], wp = padded.shape[3];
  const auto [dy, dx] = kNeighbours[d];
  const std::size_t rows = dy ? 1 : hp - 2, cols = dx ? 1 : wp - 2;
  const std::size_t i0 = halo_start(dy, hp - 2), j0 = halo_start(dx, wp - 2);
  if (piece.size() != planes * rows * cols)
    fail("halo exchange: a piece from direction ({}, {}) has {} values, expected {}", dy, dx, piece.size(),
         planes * rows * cols);
  const float* src = piece.data();
  for (std::size_t p = 0; p < planes; ++p)
    for (std::size_t i = 0; i < rows; ++i, src += cols)
      std::copy_n(src, cols, padded.data.data() + (p * hp + i0 + i) * wp + j0);
}

HaloExchange::HaloExchange(const Mesh& mesh, const Comm& world, const Comm& patch_group, HaloMode mode,
                           HaloFaults faults)
    : mesh_(mesh), world_(world), group_(patch_group), mode_(mode), faults_(faults),
      me_(TilePlace::of(mesh, world.rank())) {}

int HaloExchange::source(int rank, std::size_t d) const {
  if (faults_.dropped || (faults_.corners_missing && is_corner(d))) return -1;
  const TilePlace t = TilePlace::of(mesh_, rank);
  const int row = t.row + kNeighbours[d].first, col = t.col + kNeighbours[d].second;
  if (row < 0 || row >= t.ph || col < 0 || col >= t.pw) return -1;
  if (faults_.wrong_peer) return row * t.pw + col;
  std::vector<int> coords = mesh_.coords(rank);
  coords[std::size_t(mesh_.axis_index("ph"))] = row;
  coords[std::size_t(mesh_.axis_index("pw"))] = col;
  return mesh_.rank_of(coords);
}

PendingHalo HaloExchange::start(const Tensor& x) const {
  PendingHalo p;
  const std::size_t n = x.shape[0], ch = x.shape[1], h = x.shape[2], w = x.shape[3];
  p.padded = ref::pad1(x);
  const int me = world_.rank();
  std::array<std::size_t, 8> piece_size{};
  for (std::size_t d = 0; d < 8; ++d)
    piece_size[d] = n * ch * (kNeighbours[d].first ? 1 : h) * (kNeighbours[d].second ? 1 : w);

  if (mode_ == HaloMode::allgather) {
    // Every rank's eight pieces, gathered; this rank reads its neighbours'
    // by their place in the patch group (where the gather put them).
    std::vector<float> mine;
    for (std::size_t d = 0; d < 8; ++d) {
      const auto piece = border_piece(x, d);
      mine.insert(mine.end(), piece.begin(), piece.end());
    }
    const std::vector<float> all = group_.all_gather(std::span<const float>(mine));
    for (std::size_t d = 0; d < 8; ++d) {
      if (source(me, d) < 0) continue;
      const int row = me_.row + kNeighbours[d].first, col = me_.col + kNeighbours[d].second;
      std::size_t at = std::size_t(row * me_.pw + col) * mine.size();
      for (std::size_t e = 0; e < d; ++e) at += piece_size[e];
      p.incoming[d].assign(all.begin() + long(at), all.begin() + long(at + piece_size[d]));
    }
    return p;
  }

  // Point to point. Every rank knows where every rank takes each halo from,
  // so it sends each piece to exactly the ranks that take it from here.
  std::vector<Comm::Message<const float>> sends;
  std::vector<Comm::Message<float>> recvs;
  for (std::size_t d = 0; d < 8; ++d) {
    if (const int from = source(me, d); from >= 0) {
      p.incoming[d].resize(piece_size[d]);
      recvs.push_back({from, int(d), std::span<float>(p.incoming[d])});
    }
  }
  for (int q = 0; q < world_.size(); ++q)
    for (std::size_t d = 0; d < 8; ++d)
      if (source(q, d) == me) p.outgoing.push_back(border_piece(x, d)), sends.push_back({q, int(d), {}});
  for (std::size_t k = 0; k < sends.size(); ++k) sends[k].data = std::span<const float>(p.outgoing[k]);
  p.request = world_.iexchange(sends, recvs);
  return p;
}

void HaloExchange::finish(PendingHalo& p) const {
  p.request.wait();
  for (std::size_t d = 0; d < 8; ++d)
    if (!p.incoming[d].empty()) place_halo(p.padded, d, p.incoming[d]);
}

}  // namespace dc::vae
