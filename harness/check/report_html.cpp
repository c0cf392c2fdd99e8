// One self-contained HTML page for a run or comparison (--html FILE): inline
// CSS and SVG, no script, no network, opens from disk. What a person needs
// without scrolling: the verdict, the first divergence in words, a heatmap of
// taps x ranks and the tap table. Hovering a heatmap cell shows its numbers
// (SVG <title>, so no JavaScript is needed).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "harness/check/report.h"
#include "harness/core/tensor.h"

namespace dc {
namespace {

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

std::string sci(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return "0";
  return fmt::format("{:.3g}", v);
}

// Columns of the heatmap: every rank up to kMaxColumns; beyond, contiguous
// rank ranges, each cell showing the worst of its ranks.
constexpr std::size_t kMaxColumns = 256;

struct Cell {
  long long nonfinite = 0;
  double replica = 0;      // largest |difference| to the replica leader
  double ratio = -1;       // err/tol, -1: no reference
  int first = 0, last = 0;  // ranks
};

Cell cell_of(const TapVerdict& t, int first, int last) {
  Cell c;
  c.first = first;
  c.last = last;
  for (int r = first; r <= last; ++r) {
    const auto i = static_cast<std::size_t>(r);
    if (i < t.ranks.nonfinite.size()) c.nonfinite += t.ranks.nonfinite[i];
    if (i < t.ranks.replica_diff.size()) {
      const double d = t.ranks.replica_diff[i];
      if (std::isnan(d) || d > c.replica || (std::isnan(c.replica) == false && std::isinf(d))) c.replica = d;
    }
    if (i < t.ranks.err_over_tol.size()) {
      const double q = t.ranks.err_over_tol[i];
      if (std::isnan(q) || q > c.ratio) c.ratio = q;
    }
  }
  return c;
}

// Log colour scale of err/tol: greens below 1 (1e-4 and less palest), reds
// above (1e4 and more darkest). Non-finite values and replica mismatches get
// colours of their own.
std::string colour(const Cell& c, const char*& kind) {
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

std::string heatmap(const ActivationSet& set, const CompareResult& res) {
  const int world = std::max(1, set.world_size);
  const std::size_t columns = std::min<std::size_t>(static_cast<std::size_t>(world), kMaxColumns);
  const int per = static_cast<int>((static_cast<std::size_t>(world) + columns - 1) / columns);
  const int cw = columns <= 32 ? 22 : columns <= 64 ? 12 : 4, ch = 18, left = 230, top = 34;
  const int width = left + static_cast<int>(columns) * cw + 10;
  const int height = top + static_cast<int>(res.taps.size()) * ch + 10;
  std::string s = fmt::format(
      "<svg id=\"heatmap\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "role=\"img\" aria-label=\"error over tolerance per tap and rank\">\n",
      width, height);
  // Rank labels: every column when few, else every eighth.
  const int step = columns <= 32 ? 1 : 8;
  for (std::size_t col = 0; col < columns; col += static_cast<std::size_t>(step)) {
    const int first = static_cast<int>(col) * per;
    s += fmt::format("<text class=\"rank-label\" x=\"{}\" y=\"{}\">{}</text>\n", left + static_cast<int>(col) * cw + 2,
                     top - 6, first);
  }
  s += fmt::format("<text x=\"{}\" y=\"12\" class=\"axis\">rank{} &#8594;</text>\n", left,
                   per > 1 ? fmt::format(" (each column: {} ranks, worst shown)", per) : "");
  for (std::size_t i = 0; i < res.taps.size(); ++i) {
    const TapVerdict& t = res.taps[i];
    const int y = top + static_cast<int>(i) * ch;
    const bool first = res.first_divergence == i;
    s += fmt::format("<text class=\"tap-label{}\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}{}</text>\n",
                     first ? " first" : "", left - 6, y + ch - 5, first ? "&#9654; " : "", esc(t.name));
    for (std::size_t col = 0; col < columns; ++col) {
      const int r0 = static_cast<int>(col) * per, r1 = std::min(world - 1, r0 + per - 1);
      if (r0 > r1) break;
      const Cell c = cell_of(t, r0, r1);
      const char* kind = "";
      const std::string fill = colour(c, kind);
      std::string tip = fmt::format("tap {} ({}), rank{} {}{}", t.name, i, r0 == r1 ? "" : "s", r0,
                                    r0 == r1 ? "" : fmt::format("-{}", r1));
      tip += c.ratio >= 0 || std::isnan(c.ratio) ? fmt::format("\nerr/tol {}", sci(c.ratio)) : "\nno reference";
      if (c.nonfinite) tip += fmt::format("\n{} NaN/Inf", c.nonfinite);
      if (c.replica != 0) tip += fmt::format("\nreplica difference {}", sci(c.replica));
      s += fmt::format(
          "<rect class=\"cell {}\" data-tap=\"{}\" data-rank=\"{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" "
          "fill=\"{}\"><title>{}</title></rect>\n",
          kind, esc(t.name), r0, left + static_cast<int>(col) * cw, y, cw - 1, ch - 2, fill, esc(tip));
    }
  }
  s += "</svg>\n";
  return s;
}

std::string legend() {
  return "<div class=\"legend\"><span><i style=\"background:rgb(232,245,233)\"></i>err/tol &#8804; 1e-4</span>"
         "<span><i style=\"background:rgb(102,175,83)\"></i>err/tol 1</span>"
         "<span><i style=\"background:rgb(183,77,77)\"></i>err/tol 100</span>"
         "<span><i style=\"background:#7f0000\"></i>&#8805; 1e4, NaN error</span>"
         "<span><i style=\"background:#ef6c00\"></i>replica differs</span>"
         "<span><i style=\"background:#6a1b9a\"></i>NaN/Inf on the rank</span>"
         "<span><i style=\"background:#e0e0e0\"></i>no reference</span></div>\n";
}

std::string tap_table(const CompareResult& res) {
  std::string s =
      "<table id=\"taps\"><thead><tr><th>#</th><th>tap</th><th>layout</th><th>nan/inf</th><th>replica diff</th>"
      "<th>max abs</th><th>max rel</th><th>rel L2</th><th>worst err/tol</th><th>verdict</th></tr></thead><tbody>\n";
  for (std::size_t i = 0; i < res.taps.size(); ++i) {
    const TapVerdict& t = res.taps[i];
    const auto& ref = t.reference;
    std::string verdict = "PASS";
    if (!t.pass()) {
      verdict = "FAIL (";
      const auto checks = t.failed_checks();
      for (std::size_t k = 0; k < checks.size(); ++k) verdict += (k ? ", " : "") + checks[k];
      verdict += ")";
    }
    std::string cls = t.pass() ? "pass" : "fail";
    if (res.first_divergence == i) cls += " first";
    s += fmt::format(
        "<tr class=\"{}\" data-tap=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td>{}</td></tr>\n",
        cls, esc(t.name), i, esc(t.name), esc(t.layout),
        t.nonfinite.nan + t.nonfinite.inf ? fmt::format("{} / {}", t.nonfinite.nan, t.nonfinite.inf) : "-",
        !t.replica.applies ? "n/a" : t.replica.differing.empty() ? "equal" : sci(t.replica.max_abs),
        ref.present ? sci(ref.max_abs) : "-", ref.present ? sci(ref.max_rel) : "-",
        ref.present ? sci(ref.rel_l2) : "-", ref.present ? sci(ref.worst_ratio) : "-", esc(verdict));
  }
  s += "</tbody></table>\n";
  return s;
}

const char* kStyle = R"(
body{font:14px/1.4 system-ui,sans-serif;margin:16px 24px;color:#212121}
h1{font-size:20px;margin:0 0 4px}
.meta{color:#616161;margin-bottom:10px}
.verdict{display:inline-block;padding:2px 10px;border-radius:4px;color:#fff;font-weight:600}
.verdict.pass{background:#2e7d32}.verdict.fail{background:#c62828}
#first-divergence{background:#fff3e0;border-left:4px solid #ef6c00;padding:8px 12px;white-space:pre-wrap;
 font:13px/1.4 ui-monospace,monospace;margin:10px 0}
.row{display:flex;gap:24px;align-items:flex-start;flex-wrap:wrap}
svg text{font:11px ui-monospace,monospace;fill:#424242}
svg text.first{font-weight:700;fill:#c62828}
svg rect.cell:hover{stroke:#000;stroke-width:1.5}
.legend{display:flex;flex-wrap:wrap;gap:12px;font-size:12px;margin:4px 0 12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px;border:1px solid #9e9e9e}
table{border-collapse:collapse;font:12px ui-monospace,monospace}
th,td{padding:2px 8px;border-bottom:1px solid #e0e0e0;text-align:right}
th:nth-child(2),td:nth-child(2),th:nth-child(3),td:nth-child(3),td:last-child{text-align:left}
tr.fail td:last-child{color:#c62828;font-weight:600}
tr.first{background:#ffebee;outline:2px solid #c62828}
)";

class HtmlReporter final : public Reporter {
 public:
  void report(const ActivationSet& set, const CompareResult& res, std::ostream& out) override {
    const auto scenario = set.info.find("scenario");
    const std::string title =
        scenario != set.info.end() ? fmt::format("diffcheck: {}", scenario->second) : "diffcheck compare";
    std::string meta = fmt::format("{} &middot; mesh {} ({} ranks)", esc(set.source), esc(set.mesh.str()),
                                   set.world_size);
    for (const char* k : {"flags", "dtype", "seed"})
      if (auto it = set.info.find(k); it != set.info.end() && !it->second.empty())
        meta += fmt::format(" &middot; {} {}", k, esc(it->second));
    std::size_t failing = 0;
    for (const auto& t : res.taps) failing += !t.pass();
    out << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>" << esc(title)
        << "</title>\n<style>" << kStyle << "</style></head><body>\n";
    out << "<h1>" << esc(title) << " <span class=\"verdict " << (res.pass() ? "pass\">PASS" : "fail\">FAIL")
        << "</span></h1>\n<div class=\"meta\">" << meta << " &middot; " << res.taps.size() << " taps, " << failing
        << " failing</div>\n";
    if (!res.pass())
      out << "<pre id=\"first-divergence\">" << esc(describe_first_divergence(set, res)) << "</pre>\n";
    else
      out << "<p id=\"all-pass\">Every check of every tap passes.</p>\n";
    out << "<h2 style=\"font-size:15px\">Error over tolerance, per tap and rank</h2>\n" << legend();
    out << "<div class=\"row\">" << heatmap(set, res) << "</div>\n";
    out << "<h2 style=\"font-size:15px\">Taps, in execution order</h2>\n" << tap_table(res);
    out << "</body></html>\n";
  }
};

}  // namespace

std::unique_ptr<Reporter> make_html_reporter() { return std::make_unique<HtmlReporter>(); }

}  // namespace dc
