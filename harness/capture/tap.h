// The tap recorder: what a scenario calls to capture a named tensor with its
// layout. Records keep execution order; the reference rank also keeps the
// single-rank reference of each tap (its GLOBAL tensor, in float64).
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/core/dtype.h"
#include "harness/core/layout.h"
#include "harness/core/mesh.h"
#include "harness/core/tensor.h"

namespace dc {

struct TapOptions {
  Layout layout;                   // default: replicated over the whole mesh
  long reduction_depth = 0;        // terms summed into each element; 0 = not stated
  std::optional<double> atol;      // per-tap tolerance overrides
  std::optional<double> rtol;
};

struct TapRecord {
  std::string name;
  Tensor local;
  TapOptions opts;
  int order = 0;
};

class TapRecorder {
 public:
  TapRecorder(Mesh mesh, int rank, DType dtype, int reference_rank = 0);

  // Capture this rank's piece of tap `name`. Every rank must record the same
  // taps in the same order with the same local shapes.
  void tap(const std::string& name, const Tensor& local, TapOptions opts = {});

  // The single-rank reference of a tap; kept only on the reference rank.
  bool is_reference_rank() const { return rank_ == reference_rank_; }
  void reference(const std::string& name, const RefTensor& global);

  const std::vector<TapRecord>& records() const { return records_; }
  const std::map<std::string, RefTensor>& references() const { return references_; }
  const Mesh& mesh() const { return mesh_; }
  DType dtype() const { return dtype_; }
  int rank() const { return rank_; }

 private:
  Mesh mesh_;
  int rank_;
  DType dtype_;
  int reference_rank_;
  std::vector<TapRecord> records_;
  std::map<std::string, RefTensor> references_;
};

// Tap names are paths below /taps: non-empty parts separated by '/'.
void validate_tap_name(const std::string& name);

}  // namespace dc
