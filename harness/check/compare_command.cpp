#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "harness/check/compare_command.h"
#include "harness/capture/store.h"
#include "harness/check/report.h"
#include "harness/core/error.h"

namespace dc {

int compare_and_report(const std::string& source, const std::string& reference,
                       const ReportOptions& opts) {
  ActivationSet set = read_activations(source, reference);
  CompareResult res = compare(set, opts.compare);
  make_console_reporter()->report(set, res, std::cout);
  std::cout.flush();
  if (!opts.json_path.empty()) {
    // Whole or absent, like run files.
    std::string tmp = opts.json_path + ".tmp";
    {
      std::ofstream out(tmp);
      if (!out) fail("cannot write JSON report '{}'", tmp);
      make_json_reporter()->report(set, res, out);
      if (!out) fail("cannot write JSON report '{}'", tmp);
    }
    std::filesystem::rename(tmp, opts.json_path);
  }
  return res.pass() ? kExitPass : kExitMismatch;
}

}  // namespace dc
