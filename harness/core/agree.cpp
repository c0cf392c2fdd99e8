#include "harness/core/agree.h"

#include "harness/core/error.h"

namespace dc {
namespace {

// "S<result>", "I<input error>" or "E<error>".
std::string outcome_of(const std::function<std::string()>& work) {
  try {
    return "S" + work();
  } catch (const InputError& e) {
    return std::string("I") + e.what();
  } catch (const std::exception& e) {
    return std::string("E") + e.what();
  }
}

// The result of an outcome, or its error thrown.
std::string result_of(const std::string& outcome, const Comm& c) {
  if (outcome.empty()) fail("rank {}: an empty outcome from another process", c.rank());
  if (outcome[0] == 'I') throw InputError(outcome.substr(1));
  if (outcome[0] == 'E') {
    if (c.name() == "world") throw AgreedError(outcome.substr(1));  // every process of the job has it
    throw Error(outcome.substr(1));
  }
  return outcome.substr(1);
}

}  // namespace

std::string agreed_on_root(const Comm& c, int root, const std::function<std::string()>& work) {
  std::string outcome;
  if (c.rank() == root) outcome = outcome_of(work);
  return result_of(c.broadcast_string(outcome, root), c);
}

std::vector<std::string> agreed_on_all(const Comm& c, const std::function<std::string()>& work) {
  const std::vector<std::string> all = c.all_gather_strings(outcome_of(work));
  for (const auto& o : all)  // the lowest rank's error first
    if (o.empty() || o[0] != 'S') result_of(o, c);
  std::vector<std::string> results;
  results.reserve(all.size());
  for (const auto& o : all) results.push_back(o.substr(1));
  return results;
}

}  // namespace dc
