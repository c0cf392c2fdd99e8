// Small in-memory activation sets for the comparator's unit tests.
#pragma once
#include <string>

#include "harness/capture/activations.h"

namespace dc::test {

// An empty set on `mesh` (its world size from the mesh), named "test".
inline ActivationSet empty_set(const std::string& mesh) {
  ActivationSet s;
  s.mesh = Mesh::parse(mesh);
  s.world_size = s.mesh.world_size();
  s.source = "test";
  return s;
}

// A tap "t" of `dtype` laid out as `spec` and `partial`, its shapes and data still to give.
inline TapData tap_t(const std::string& dtype, const std::string& spec, const std::string& partial) {
  TapData t;
  t.name = "t";
  t.dtype = dtype;
  t.layout = Layout::parse(spec, partial);
  return t;
}

}  // namespace dc::test
