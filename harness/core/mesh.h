// A mesh is named axes with sizes ("dp=2,tp=4"). Rank r's coordinates are the
// mixed-radix digits of r over the axes, LAST axis fastest, exactly as
// jax.sharding.Mesh(np.arange(n).reshape(sizes), names). Pure arithmetic: no MPI.
#pragma once
#include <string>
#include <vector>

namespace dc {

struct Axis {
  std::string name;
  int size = 1;
};

class Mesh {
 public:
  Mesh() = default;
  explicit Mesh(std::vector<Axis> axes);

  // Parses "dp=2,tp=4"; throws InputError naming the bad part.
  static Mesh parse(const std::string& text);

  const std::vector<Axis>& axes() const { return axes_; }
  int world_size() const;
  std::string str() const;

  // Index of an axis by name, or -1.
  int axis_index(const std::string& name) const;
  int axis_size(const std::string& name) const;  // throws for unknown names

  std::vector<int> coords(int rank) const;
  int rank_of(const std::vector<int>& coords) const;

  // Ranks that share every coordinate outside `group_axes` with `rank`, in rank
  // order. These are the members of rank's communicator over `group_axes`.
  std::vector<int> group(int rank, const std::vector<std::string>& group_axes) const;

  // Mixed-radix index of rank's coordinates over `group_axes`, major first.
  int index_in(int rank, const std::vector<std::string>& group_axes) const;

  // Throws InputError unless the mesh has exactly `world` ranks.
  void require_world(int world) const;

 private:
  std::vector<Axis> axes_;
};

bool valid_axis_name(const std::string& s);

// A sorted rank list in short form: "0-2,4,6-15".
std::string rank_ranges(const std::vector<int>& ranks);

}  // namespace dc
