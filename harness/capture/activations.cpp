#include "harness/capture/activations.h"

#include <algorithm>

#include "harness/core/error.h"

namespace dc {
namespace {

// Copies the box `slab` of a row-major tensor of `shape`, in the box's own
// row-major order (what an HDF5 hyperslab read into a flat buffer gives).
void copy_slab(const std::vector<double>& src, const Shape& shape, const Slab& slab, double* out,
               const std::string& what) {
  if (src.size() != numel(shape)) fail("in-memory activations: {} does not match its shape", what);
  const std::size_t n = numel(slab.count);
  if (n == 0) return;
  if (shape.empty()) {
    out[0] = src[0];
    return;
  }
  const std::size_t nd = shape.size(), row = slab.count[nd - 1];
  const auto strides = strides_of(shape);
  std::vector<std::size_t> idx(nd, 0);  // position within the box, last dimension held at 0
  for (std::size_t done = 0; done < n; done += row) {
    std::size_t at = 0;
    for (std::size_t d = 0; d < nd; ++d) at += (slab.start[d] + idx[d]) * strides[d];
    std::copy_n(src.begin() + static_cast<std::ptrdiff_t>(at), row, out + done);
    for (std::size_t d = nd - 1; d-- > 0;) {  // odometer over all but the last dimension
      if (++idx[d] < slab.count[d]) break;
      idx[d] = 0;
    }
  }
}

Slab whole(const Shape& s) { return {Shape(s.size(), 0), s}; }

}  // namespace

void InMemoryData::read_piece(const TapData& t, int rank, const Slab& slab, double* out) const {
  copy_slab(pieces.at(t.data_id).at(rank), t.local_shape, slab, out, "tap '" + t.name + "'");
}

void InMemoryData::read_reference(const TapData& t, const Slab& slab, double* out) const {
  copy_slab(references.at(t.data_id), *t.reference_shape, slab, out,
            "reference of tap '" + t.name + "'");
}

std::vector<double> read_whole_piece(const ActivationSet& set, const TapData& t, int rank) {
  std::vector<double> v(numel(t.local_shape));
  if (!v.empty()) set.data->read_piece(t, rank, whole(t.local_shape), v.data());
  return v;
}

std::vector<double> read_whole_reference(const ActivationSet& set, const TapData& t) {
  if (!t.reference_shape) return {};
  std::vector<double> v(numel(*t.reference_shape));
  if (!v.empty()) set.data->read_reference(t, whole(*t.reference_shape), v.data());
  return v;
}

// Sources every process can read need no staging.
void ActivationData::stage(const TapData&, const std::vector<PlannedRead>&) const {}
int ActivationData::reference_holder(const TapData&, const Slab&) const { return 0; }

std::string root_info(const ActivationSet& set, const char* key) {
  auto it = set.info.find(key);
  return it == set.info.end() ? std::string() : it->second;
}

}  // namespace dc
