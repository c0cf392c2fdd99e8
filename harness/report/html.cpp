#include "harness/report/html.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace dc::html {

std::string esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string num(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return "0";
  return fmt::format("{:.3g}", v);
}

std::string fill(const CellState& c, std::string& kind) {
  if (c.error) {
    kind = "error";
    return "#757575";
  }
  if (c.nonfinite > 0) {
    kind = "nonfinite";
    return "#6a1b9a";
  }
  if (c.replica != 0) {
    kind = "replica";
    return "#ef6c00";
  }
  if (c.ratio < 0) {
    kind = "noref";
    return "#e0e0e0";
  }
  kind = c.ratio > 1 || std::isnan(c.ratio) ? "fail" : "pass";
  if (std::isnan(c.ratio) || std::isinf(c.ratio)) return "#7f0000";
  const double l = std::log10(std::max(c.ratio, 1e-12));
  if (c.ratio <= 1) {
    const double f = std::clamp((l + 4) / 4, 0.0, 1.0);  // 1e-4 -> 0, 1 -> 1
    return fmt::format("rgb({},{},{})", static_cast<int>(232 - 130 * f), static_cast<int>(245 - 70 * f),
                       static_cast<int>(233 - 150 * f));
  }
  const double f = std::clamp(l / 4, 0.0, 1.0);  // 1 -> 0, 1e4 -> 1
  return fmt::format("rgb({},{},{})", static_cast<int>(239 - 112 * f), static_cast<int>(154 - 154 * f),
                     static_cast<int>(154 - 154 * f));
}

std::string legend() {
  return "<div class=\"legend\"><span><i style=\"background:rgb(232,245,233)\"></i>err/tol &#8804; 1e-4</span>"
         "<span><i style=\"background:rgb(102,175,83)\"></i>err/tol 1</span>"
         "<span><i style=\"background:rgb(183,77,77)\"></i>err/tol 100</span>"
         "<span><i style=\"background:#7f0000\"></i>&#8805; 1e4, NaN error</span>"
         "<span><i style=\"background:#ef6c00\"></i>replicas differ</span>"
         "<span><i style=\"background:#6a1b9a\"></i>NaN/Inf</span>"
         "<span><i style=\"background:#e0e0e0\"></i>no reference</span>"
         "<span><i style=\"background:#757575\"></i>no result (crash, time-out, error)</span></div>\n";
}

namespace {
const char* kStyle = R"(
body{font:14px/1.4 system-ui,sans-serif;margin:16px 24px;color:#212121}
h1{font-size:20px;margin:0 0 4px} h2{font-size:15px}
.meta{color:#616161;margin-bottom:10px}
.images figure{display:inline-block;margin:0 14px 8px 0;vertical-align:top} .images img{image-rendering:pixelated;border:1px solid #ccc} .images h3{font-size:14px}
.verdict{display:inline-block;padding:2px 10px;border-radius:4px;color:#fff;font-weight:600}
.verdict.pass{background:#2e7d32}.verdict.fail{background:#c62828}
#first-divergence{background:#fff3e0;border-left:4px solid #ef6c00;padding:8px 12px;white-space:pre-wrap;
 font:13px/1.4 ui-monospace,monospace;margin:10px 0}
svg text{font:11px ui-monospace,monospace;fill:#424242}
svg text.first{font-weight:700;fill:#c62828}
svg text.fail{fill:#c62828}
svg rect.cell:hover{stroke:#000;stroke-width:1.5}
.legend{display:flex;flex-wrap:wrap;gap:12px;font-size:12px;margin:4px 0 12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px;border:1px solid #9e9e9e}
table{border-collapse:collapse;font:12px ui-monospace,monospace}
th,td{padding:2px 8px;border-bottom:1px solid #e0e0e0;text-align:right}
td.l,th.l{text-align:left}
tr.fail td.v{color:#c62828;font-weight:600}
tr.unchecked td.v{color:#b26a00;font-weight:600}
tr.first{background:#ffebee;outline:2px solid #c62828}
tr.wrong td.name{text-decoration:line-through;color:#9e9e9e}
)";
}  // namespace

std::string page_begin(const std::string& title) {
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>{}</title>\n<style>{}</style>"
      "</head><body>\n",
      esc(title), kStyle);
}

std::string page_end() { return "</body></html>\n"; }

std::string verdict_badge(bool pass, const std::string& text) {
  return fmt::format("<span class=\"verdict {}\">{}</span>", pass ? "pass" : "fail", esc(text));
}

}  // namespace dc::html
