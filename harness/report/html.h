// Pieces shared by the HTML pages (run/compare report, sweep-mesh, sweep,
// bisect): escaping, number format, the err/tol colour scale and its legend,
// and the page frame. Self-contained pages: inline CSS and SVG, no script.
#pragma once
#include <string>

namespace dc::html {

std::string esc(const std::string& s);
std::string num(double v);  // 3 significant digits; nan, inf

// What a heatmap cell shows, in order of precedence.
struct CellState {
  long long nonfinite = 0;  // NaN/Inf values
  double replica = 0;       // |difference| to the replica leader; 0: equal
  double ratio = -1;        // err/tol; -1: no reference
  bool error = false;       // no result at all (crash, time-out, error)
};
// The cell's fill and its class ("pass", "fail", "replica", "nonfinite",
// "noref", "error"). Log scale: greens up to err/tol 1, reds above.
std::string fill(const CellState& c, std::string& kind);
std::string legend();

// <!DOCTYPE html> ... <body> with the shared style, and the closing tags.
std::string page_begin(const std::string& title);
std::string page_end();
// "<span class="verdict pass|fail">TEXT</span>"
std::string verdict_badge(bool pass, const std::string& text);

}  // namespace dc::html
