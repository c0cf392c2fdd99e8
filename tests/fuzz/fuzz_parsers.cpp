// libFuzzer target for the text a user types: the mesh ("dp=2,tp=4"), the
// layout strings of the activation format (spec, partial) and flag
// assignments (--flag, DIFFCHECK_FLAGS). The first byte picks the parser.
// Beyond "no crash, no undefined behaviour", each parser's output must
// round-trip through its own printer, and the mesh arithmetic must agree with
// itself; a violation traps, so libFuzzer records the input.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "harness/core/error.h"
#include "harness/core/flags.h"
#include "harness/core/layout.h"
#include "harness/core/mesh.h"

namespace {

void require(bool ok) {
  if (!ok) __builtin_trap();
}

void fuzz_mesh(const std::string& text) {
  dc::Mesh mesh;
  try {
    mesh = dc::Mesh::parse(text);
  } catch (const dc::InputError&) {
    return;
  }
  require(dc::Mesh::parse(mesh.str()).str() == mesh.str());
  const long world = mesh.world_size();
  require(world >= 1);
  std::vector<std::string> first_axis{mesh.axes().front().name};
  for (long r : {0L, world / 2, world - 1}) {
    int rank = static_cast<int>(r);
    require(mesh.rank_of(mesh.coords(rank)) == rank);
    if (world <= (1 << 16)) {
      auto g = mesh.group(rank, first_axis);
      require(static_cast<int>(g.size()) == mesh.axes().front().size);
      require(g[static_cast<std::size_t>(mesh.index_in(rank, first_axis))] == rank);
      (void)dc::rank_ranges(g);
    }
  }
}

void fuzz_layout(const std::string& text) {
  auto bar = text.find('|');
  std::string spec = text.substr(0, bar);
  std::string partial = bar == std::string::npos ? "" : text.substr(bar + 1);
  dc::Layout layout;
  try {
    layout = dc::Layout::parse(spec, partial);
  } catch (const dc::InputError&) {
    return;
  }
  require(dc::Layout::parse(layout.spec_str(), layout.partial_str()).str() == layout.str());
  static const dc::Mesh mesh = dc::Mesh::parse("dp=2,sp=3,tp=4");
  const dc::Shape local{2, 3, 4, 5};
  try {
    layout.validate(mesh, local.size());
  } catch (const dc::InputError&) {
    return;
  }
  dc::Shape global = layout.global_shape(mesh, local);
  require(global.size() == local.size());
  for (int r = 0; r < mesh.world_size(); ++r) {
    auto block = layout.block_of(mesh, r, local.size());
    for (std::size_t d = 0; d < local.size(); ++d) require((block[d] + 1) * local[d] <= global[d]);
  }
  (void)layout.replica_axes(mesh);
}

void fuzz_flags(const std::string& text) {
  static const std::vector<dc::FlagSpec> specs{
      {"async", dc::FlagType::boolean, "false", ""},
      {"chunks", dc::FlagType::integer, "1", ""},
      {"merge", dc::FlagType::string, "sigmoid", ""},
  };
  dc::FlagValues values;
  try {
    values = dc::FlagValues::resolve(specs, dc::split_flag_list(text), "fuzz");
  } catch (const dc::InputError&) {
    return;
  }
  // What a run writes into its file's `flags` attribute must read back as the same flags.
  auto again = dc::FlagValues::resolve(specs, dc::split_flag_list(values.str()), "fuzz");
  require(again.str() == values.str());
  (void)values.get_bool("async");
  (void)values.get_int("chunks");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      fuzz_mesh(text);
      break;
    case 1:
      fuzz_layout(text);
      break;
    default:
      fuzz_flags(text);
      break;
  }
  return 0;
}
