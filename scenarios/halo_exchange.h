// The halo exchange of a patch-parallel convolution (xDiT's patch-parallel
// VAE, TensorRT-LLM's HaloExchangeConv2d): each rank holds one tile of a
// ph x pw grid (its patch group: the ranks that share its dp coordinate), and
// before a 3x3 convolution it needs a one-pixel border of its neighbours'
// rows and columns — the eight neighbours' when ph and pw are both > 1 (the
// corners). Zeros stay where the tile meets the image's edge.
//
// Two ways, giving the same halos bit for bit:
//   p2p        point to point with each neighbour (non-blocking: an exchange
//              can be started, the tile's interior computed, then finished);
//   allgather  every rank's border pieces gathered over the patch group,
//              each rank picking its neighbours' (blocking).
// And the faults of real halo code, so that their runs show what they do.
#pragma once
#include <array>
#include <memory>
#include <utility>
#include <vector>

#include "harness/core/comm.h"
#include "harness/core/mesh.h"
#include "harness/core/tensor.h"

namespace dc::vae {

enum class HaloMode { p2p, allgather };

struct HaloFaults {
  // The neighbour's patch-group rank (row * pw + col) used as a world rank,
  // as if the patch group started at world rank 0 (TensorRT-LLM#16999).
  bool wrong_peer = false;
  bool dropped = false;          // no exchange: zero padding at tile borders (sglang#34424)
  bool corners_missing = false;  // edges exchanged, the four corners left zero
};

// The eight neighbours (dy, dx); a message's tag is its direction's index.
inline constexpr std::array<std::pair<int, int>, 8> kNeighbours = {
    {{-1, 0}, {1, 0}, {0, -1}, {0, 1}, {-1, -1}, {-1, 1}, {1, -1}, {1, 1}}};

// This rank's place in its patch group. Throws InputError unless the mesh has
// the axes ph and pw.
struct TilePlace {
  int ph = 1, pw = 1, row = 0, col = 0;
  static TilePlace of(const Mesh& mesh, int rank);
};

// An exchange under way: the padded tile [n, C, h + 2, w + 2] (the tile
// copied in, zeros around) and the buffers the messages use.
struct PendingHalo {
  Tensor padded;
  std::array<std::vector<float>, 8> incoming;  // by direction; empty: nothing comes
  std::vector<std::vector<float>> outgoing;
  Request request;
};

class HaloExchange {
 public:
  // `patch_group`: this rank's communicator over {ph, pw} (allgather mode).
  HaloExchange(const Mesh& mesh, const Comm& world, const Comm& patch_group, HaloMode mode, HaloFaults faults);

  // Pads x [n, C, h, w] and starts the exchange of its border pieces.
  PendingHalo start(const Tensor& x) const;
  // Waits for the exchange and writes the halos into p.padded.
  void finish(PendingHalo& p) const;

  // The world rank whose piece `rank` takes for its halo in direction d, or
  // -1 when that side is the image's edge (or the piece is not exchanged).
  int source(int rank, std::size_t d) const;

 private:
  const Mesh& mesh_;
  const Comm& world_;
  const Comm& group_;
  HaloMode mode_;
  HaloFaults faults_;
  TilePlace me_;
};

// What the owner of tile x [n, C, h, w] sends to the rank that sees it in
// direction d = (dy, dx): the edge (row, column or corner) facing that rank,
// as [n, C, rows, cols].
std::vector<float> border_piece(const Tensor& x, std::size_t d);
// Writes a piece received from direction d into padded [n, C, h + 2, w + 2].
void place_halo(Tensor& padded, std::size_t d, const std::vector<float>& piece);

}  // namespace dc::vae
