// Flags change HOW a sharded run executes (async collectives, chunking, buffer
// reuse), never what it must compute. Each scenario declares the flags it reads;
// values come from DIFFCHECK_FLAGS and then --flag (later wins).
#pragma once
#include <map>
#include <string>
#include <vector>

namespace dc {

enum class FlagType { boolean, integer, string };

struct FlagSpec {
  std::string name;
  FlagType type = FlagType::boolean;
  std::string default_value = "false";
  std::string help;
};

struct FaultSpec {
  std::string name;
  std::string help;
};

class FlagValues {
 public:
  // `assignments` are "name=value" (or bare "name" for a boolean true), applied
  // in order. Throws InputError for unknown flags (listing the known ones) and
  // for values of the wrong type.
  static FlagValues resolve(const std::vector<FlagSpec>& specs,
                            const std::vector<std::string>& assignments,
                            const std::string& scenario);

  bool get_bool(const std::string& name) const;
  long get_int(const std::string& name) const;
  const std::string& get_string(const std::string& name) const;

  // Every flag in effect, "name=value" separated by spaces (the `flags` root attribute).
  std::string str() const;

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, FlagType> types_;
  const std::string& raw(const std::string& name) const;
};

// DIFFCHECK_FLAGS holds assignments separated by spaces or commas.
std::vector<std::string> split_flag_list(const std::string& text);
std::string flag_type_name(FlagType t);

}  // namespace dc
