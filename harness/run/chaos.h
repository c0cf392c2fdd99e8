// --chaos KIND@RANK[:after=TAP|:during=write|check]: a fault of the harness
// itself injected into one rank (a crash, a hang, a collective nobody else
// calls) or a slow rank (3 s of work that shows progress but enters no
// collective, while the others wait: not a hang), to show that the watchdog, the crash handler and the stop handler
// report and clean up what they should (tests/test_e2e_chaos.py,
// tests/test_e2e_interrupt.py).
#pragma once
#include <string>

namespace dc {

class Comm;
class TapRecorder;

class Chaos {
 public:
  // Parses the option ("" = none); a bad one is an input error naming it.
  Chaos(const std::string& spec, int world_size);

  // On `rank` (the chosen one), acts after the tap named (or the first) as
  // the scenario records them. `taps` and `world` must outlive the run.
  void arm(TapRecorder& taps, Comm& world, int rank);
  // Acts now if this is the rank and `phase` ("write": the run file's .tmp
  // exists; "check": the check starts) is the one asked for.
  void during(const char* phase, Comm& world, int rank);
  // After the scenario: warns if the tap asked for was never recorded.
  void warn_if_unused(int rank) const;

 private:
  void act(const std::string& where, Comm& world);

  enum class Kind { none, crash, hang, desync, slow } kind_ = Kind::none;
  std::string spec_;
  int rank_ = -1;
  std::string after_;   // empty: the first tap
  std::string during_;  // instead of after a tap: "write" or "check"
  bool done_ = false;
};

}  // namespace dc
