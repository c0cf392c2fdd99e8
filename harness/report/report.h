// Reporters turn a CompareResult into text. Small classes behind one interface
// so that a new format is a new class, not a new branch in the comparator.
#pragma once
#include "harness/core/mesh.h"  // rank_ranges
#include <memory>
#include <ostream>
#include <string>

#include "harness/capture/activations.h"
#include "harness/check/compare.h"
#include "harness/report/junit.h"

namespace dc {

class Reporter {
 public:
  virtual ~Reporter() = default;
  virtual void report(const ActivationSet& set, const CompareResult& res, std::ostream& out) = 0;
};

// A table (one row per tap) and a summary naming the first divergence.
std::unique_ptr<Reporter> make_console_reporter();
// Machine-readable: every number of every check (--json FILE).
std::unique_ptr<Reporter> make_json_reporter();
// One self-contained page (--html FILE): verdict, first divergence, a heatmap
// of err/tol per tap x rank, the tap table.
std::unique_ptr<Reporter> make_html_reporter();

// One paragraph: which tap diverged first, on which ranks, where, by how much.
std::string describe_first_divergence(const ActivationSet& set, const CompareResult& res);
// The same paragraph for any tap (without the "First divergence: " lead).
std::string describe_tap(const TapVerdict& t, std::size_t index);

// Where a tap's tolerance came from, its bounds and, for a measured one,
// its noise floor and clean margin (tolerance / floor), in one line:
// "calibrated: rtol 1.1e-06 (floor 4.2e-07, clean margin 2.6x), rel L2 <= ...".
std::string tolerance_line(const ReferenceCheck& ref);
// "N not checked against the reference (no reference tap): a, b, ..." (the first five named).
std::string unchecked_sentence(const std::vector<std::string>& names);
// The report table's tolerance cell: the source, and for a derived tolerance
// its depth and math ("derived d1536 TF32").
std::string tolerance_cell(const Tolerance& tol);
// The console table's column: the cell, and ", ref float32" for a reference no wider than the run.
std::string tolerance_column(const ReferenceCheck& ref);
// For a failing derived float32 tap whose file states no math: a line saying
// when its error is the size TF32 or bfloat16 matmuls give; else empty.
std::string math_hint(const ReferenceCheck& ref);

// The JUnit suite of a run or comparison: one test case per tap, in order;
// a failing tap's failure carries its paragraph. `name` names the suite
// (e.g. "flux_tp dp=4,tp=4 float32"); `seconds` is the whole run's time.
JUnitSuite junit_suite(const ActivationSet& set, const CompareResult& res, const std::string& name,
                       double seconds);


}  // namespace dc
