#include "harness/capture/tap.h"

#include <algorithm>

#include "harness/core/error.h"

namespace dc {

void validate_tap_name(const std::string& name) {
  if (name.empty() || name.front() == '/' || name.back() == '/' ||
      name.find("//") != std::string::npos || name.find('.') == 0)
    fail("tap name '{}' is not a path of non-empty parts separated by '/'", name);
}

TapRecorder::TapRecorder(Mesh mesh, int rank, DType dtype, int reference_rank)
    : mesh_(std::move(mesh)), rank_(rank), dtype_(dtype), reference_rank_(reference_rank) {}

void TapRecorder::tap(const std::string& name, const Tensor& local, TapOptions opts) {
  validate_tap_name(name);
  if (std::any_of(records_.begin(), records_.end(), [&](const auto& r) { return r.name == name; }))
    fail("rank {}: tap '{}' recorded twice", rank_, name);
  if (local.size() != numel(local.shape))
    fail("rank {}: tap '{}' has {} values for shape {}", rank_, name, local.size(),
         shape_str(local.shape));
  try {
    opts.layout.validate(mesh_, local.rank());
  } catch (const InputError& e) {
    fail("rank {}: tap '{}': {}", rank_, name, e.what());
  }
  int order = static_cast<int>(records_.size());
  records_.push_back(TapRecord{name, local, std::move(opts), order});
}

void TapRecorder::reference(const std::string& name, const RefTensor& global) {
  if (!is_reference_rank()) return;
  validate_tap_name(name);
  if (!references_.emplace(name, global).second)
    fail("rank {}: reference of tap '{}' recorded twice", rank_, name);
}

}  // namespace dc
