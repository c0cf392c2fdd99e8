// Taps that hold several streams along their split dimension (docs/FORMAT.md,
// `streams`). diffusers' context parallelism splits the text and the image
// tokens each over the ranks, then runs its single-stream blocks on each
// rank's [its text, its image]: rank r's piece is not the r-th block of the
// global [text, image] tensor, so no spec describes it. Each stream alone is
// a plain split, so the tap is read as one tap per stream (`name[text]`,
// `name[image]`), whose pieces and reference are slices of the same
// datasets (H5Data::add_stream). Everything after the reader (checks,
// tolerances, reports) sees ordinary taps. A stream marked `reversed` has
// its blocks in reverse rank order (Layout::reversed_dim): torch's head-tail
// load balancing gives rank r of n the sequence's chunks r and 2n-1-r, the
// head's r-th and the tail's (n-1-r)-th.
#include <fmt/format.h>

#include <tuple>

#include "harness/capture/h5_data.h"
#include "harness/capture/h5util.h"
#include "harness/capture/store_read_file.h"
#include "harness/core/error.h"
#include "harness/core/text.h"

namespace dc::read {
namespace {

// The dimension the streams lie along, and over how many blocks: the one
// split dimension whose piece length is the sum of the streams' shares.
std::pair<std::size_t, std::size_t> split_dimension(const TapData& t, const Mesh& mesh, const std::string& where) {
  std::vector<std::pair<std::size_t, std::size_t>> fits;
  bool split = false;
  for (std::size_t d = 0; d < t.layout.spec.size() && d < t.local_shape.size(); ++d) {
    if (t.layout.spec[d].empty()) continue;
    split = true;
    const std::size_t blocks = t.layout.blocks(mesh, d);
    std::size_t shares = 0;
    bool even = true;
    for (const auto& st : t.streams) {
      even = even && st.length > 0 && st.length % blocks == 0;
      shares += st.length / blocks;
    }
    if (even && shares == t.local_shape[d]) fits.emplace_back(d, blocks);
  }
  std::string lengths;
  for (const auto& st : t.streams) lengths += (lengths.empty() ? "" : ", ") + std::to_string(st.length);
  if (!split)
    input_error("{}: attribute 'streams' needs a spec that splits the dimension the streams lie along; the "
                "spec is '{}'", where, t.layout.spec_str());
  if (fits.empty())
    input_error("{}: attribute 'streams': no dimension the spec '{}' splits holds the streams (of {}) in equal "
                "shares per block adding up to the piece's length (shape {})", where, t.layout.spec_str(), lengths,
                shape_str(t.local_shape));
  if (fits.size() > 1)
    input_error("{}: attribute 'streams': dimensions {} and {} of the spec '{}' both hold the streams (of {}): "
                "which one cannot be told", where, fits[0].first, fits[1].first, t.layout.spec_str(), lengths);
  return fits.front();
}

}  // namespace

void read_streams_attr(hid_t ds, const std::string& where, const Mesh& mesh, TapData& t) {
  const auto text = h5::read_string_attr(ds, "streams", where);
  if (!text) return;
  const std::string& s = *text;
  const std::string form = "'name:length,name:length,...', the global lengths in the order the tensor holds them "
                           "(a stream whose blocks go to the ranks in reverse order: 'name:length:reversed')";
  for (const auto& part : split(s, ',')) {
    const auto fields = split(part, ':');
    if (fields.size() < 2 || fields.size() > 3 || fields[0].empty() || fields[1].empty() ||
        (fields.size() == 3 && fields[2] != "reversed"))
      input_error("{}: attribute 'streams' is '{}'; expected {}", where, s, form);
    TapData::Stream st{fields[0], 0, fields.size() == 3};
    const std::string& digits = fields[1];
    if (digits.size() > 15 || digits.find_first_not_of("0123456789") != std::string::npos)
      input_error("{}: attribute 'streams' is '{}': '{}' is not a length; expected {}", where, s, digits, form);
    st.length = std::stoull(digits);
    for (const auto& other : t.streams)
      if (other.name == st.name) input_error("{}: attribute 'streams' is '{}': stream '{}' twice", where, s, st.name);
    if (st.name.find_first_of("[]/") != std::string::npos)
      input_error("{}: attribute 'streams' is '{}': a stream's name has no '[', ']' or '/'", where, s);
    t.streams.push_back(std::move(st));
  }
  if (t.streams.size() < 2) input_error("{}: attribute 'streams' is '{}': it names fewer than two streams", where, s);
  split_dimension(t, mesh, where);  // refuses streams no split dimension holds
}

void expand_streams(ActivationSet& set, H5Data& data, const std::map<std::string, StreamSplit>* split_like) {
  std::vector<TapData> out;
  out.reserve(set.taps.size());
  for (auto& t : set.taps) {
    const StreamSplit* like = nullptr;
    if (t.streams.empty() && split_like)
      if (auto it = split_like->find(t.name); it != split_like->end()) like = &it->second;
    if ((t.streams.empty() && !like) || t.mismatched_reference_shape) {  // a shape finding is the tap's, whole
      t.streams.clear();
      out.push_back(std::move(t));
      continue;
    }
    const std::string where = fmt::format("{}: tap '{}'", set.source, t.name);
    if (t.sketch) input_error("{}: a sketch tap has no 'streams' (each stream is sketched as its own tap)", where);
    if (t.microbatches) input_error("{}: a tap with 'microbatches' has no 'streams'", where);
    if (t.layout.ordered_dim >= 0) input_error("{}: a tap with 'block_order' has no 'streams'", where);
    std::size_t dim = 0, blocks = 1;
    if (like) {  // a whole tensor (a one-device run), split as the run under check was
      t.streams = like->streams;
      dim = like->dim;
      std::size_t whole = 0;
      for (const auto& st : t.streams) whole += st.length;
      if (!t.layout.spec.empty() || dim >= t.local_shape.size() || t.local_shape[dim] != whole)
        input_error("{}: the run under check holds it as streams of {} along dimension {}, which this file's "
                    "shape {} (spec '{}') does not hold whole", where, whole, dim, shape_str(t.local_shape),
                    t.layout.spec_str());
    } else {
      std::tie(dim, blocks) = split_dimension(t, set.mesh, where);
    }
    set.stream_splits[t.name] = StreamSplit{dim, t.streams};
    std::size_t piece_offset = 0, reference_offset = 0;
    for (const auto& st : t.streams) {
      TapData s = t;
      s.streams.clear();
      s.name = t.name + "[" + st.name + "]";
      s.local_shape[dim] = st.length / blocks;
      if (s.reference_shape) (*s.reference_shape)[dim] = st.length;
      s.data_id = data.add_stream(t.data_id, dim, piece_offset, reference_offset);
      if (st.reversed) s.layout.reversed_dim = static_cast<int>(dim);
      piece_offset += st.length / blocks;
      reference_offset += st.length;
      out.push_back(std::move(s));
    }
  }
  set.taps = std::move(out);
}

}  // namespace dc::read
