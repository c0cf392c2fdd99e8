// One self-contained HTML page for a run or comparison (--html FILE): inline
// CSS and SVG, no script, no network, opens from disk. What a person needs
// without scrolling: the verdict, the first divergence in words, a heatmap of
// taps x ranks and the tap table. Hovering a heatmap cell shows its numbers
// (SVG <title>, so no JavaScript is needed).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "harness/report/html.h"
#include "harness/report/html_pipeline.h"
#include "harness/report/report.h"
#include "harness/core/tensor.h"

namespace dc {
namespace {

using html::esc;

// Columns of the heatmap: every rank up to kMaxColumns; beyond, contiguous
// rank ranges, each cell showing the worst of its ranks.
constexpr std::size_t kMaxColumns = 256;

// The worst of ranks first..last (one column); a NaN, once seen, stays.
html::CellState cell_of(const TapVerdict& t, int first, int last) {
  html::CellState c;
  auto worst = [](double& into, double v) {
    if (std::isnan(v) || v > into) into = v;
  };
  for (int r = first; r <= last; ++r) {
    const auto i = static_cast<std::size_t>(r);
    if (i < t.ranks.nonfinite.size()) c.nonfinite += t.ranks.nonfinite[i];
    if (i < t.ranks.replica_diff.size()) worst(c.replica, t.ranks.replica_diff[i]);
    if (i < t.ranks.err_over_tol.size()) worst(c.ratio, t.ranks.err_over_tol[i]);
  }
  return c;
}

std::string heatmap(const ActivationSet& set, const CompareResult& res) {
  const int world = std::max(1, set.world_size);
  const std::size_t columns = std::min<std::size_t>(static_cast<std::size_t>(world), kMaxColumns);
  const int per = static_cast<int>((static_cast<std::size_t>(world) + columns - 1) / columns);
  // The tap names' column as wide as the longest name (11 px monospace: ~7 px a character), within bounds: a
  // name cut on the left loses its layer (".0.attention.qkv_linear/0[head]"); a longer one shows whole on hover.
  std::size_t longest = 0;
  for (const auto& t : res.taps) longest = std::max(longest, t.name.size() + 2);
  const int left = static_cast<int>(std::clamp<std::size_t>(12 + 7 * longest, 230, 560));
  const int cw = columns <= 32 ? 22 : columns <= 64 ? 12 : 4, ch = 18, top = 34;
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
    // Each cell is its rank's own err/tol; a tap failing only by a limit on
    // the whole tensor (rel L2, column mean) shows it on its label.
    const auto& ref = t.reference;
    const bool whole_fails = ref.present && !ref.pass && ref.worst_ratio <= 1;
    s += fmt::format("<text class=\"tap-label{}{}\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}{}"
                     "<title>{}{}</title></text>\n",
                     first ? " first" : "", t.pass() ? "" : " fail", left - 6, y + ch - 5, first ? "&#9654; " : "",
                     esc(t.name), esc(t.name),
                     whole_fails ? fmt::format(": fails on the whole tensor: err/tol {} (rel L2{})",
                                               html::num(ref.margin()), ref.column_ratio ? ", column mean" : "")
                                 : "");
    for (std::size_t col = 0; col < columns; ++col) {
      const int r0 = static_cast<int>(col) * per, r1 = std::min(world - 1, r0 + per - 1);
      if (r0 > r1) break;
      const html::CellState c = cell_of(t, r0, r1);
      std::string kind;
      const std::string fill = html::fill(c, kind);
      std::string tip = fmt::format("tap {} ({}), rank{} {}{}", t.name, i, r0 == r1 ? "" : "s", r0,
                                    r0 == r1 ? "" : fmt::format("-{}", r1));
      tip += c.ratio >= 0 || std::isnan(c.ratio) ? fmt::format("\nerr/tol {}", html::num(c.ratio)) : "\nno reference";
      if (t.reference.mismatched_shape) tip += "\nits shape is not the reference's";
      if (c.nonfinite) tip += fmt::format("\n{} NaN/Inf", c.nonfinite);
      if (c.replica != 0) tip += fmt::format("\nreplica difference {}", html::num(c.replica));
      s += fmt::format(
          "<rect class=\"cell {}\" data-tap=\"{}\" data-rank=\"{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" "
          "fill=\"{}\"><title>{}</title></rect>\n",
          kind, esc(t.name), r0, left + static_cast<int>(col) * cw, y, cw - 1, ch - 2, fill, esc(tip));
    }
  }
  s += "</svg>\n";
  return s;
}

std::string tap_table(const CompareResult& res) {
  std::string s =
      "<table id=\"taps\"><thead><tr><th>#</th><th class=\"l\">tap</th><th class=\"l\">layout</th><th>nan/inf</th>"
      "<th>replica diff</th><th>max abs</th><th>max rel</th><th>rel L2</th><th>err/tol</th><th class=\"l\">tolerance</th>"
      "<th class=\"l\">verdict</th></tr></thead><tbody>\n";
  for (std::size_t i = 0; i < res.taps.size(); ++i) {
    const TapVerdict& t = res.taps[i];
    const auto& ref = t.reference;
    std::string verdict = t.unchecked && t.pass() ? "UNCHECKED (no reference)" : "PASS";
    if (!t.pass()) {
      verdict = "FAIL (";
      const auto checks = t.failed_checks();
      for (std::size_t k = 0; k < checks.size(); ++k) verdict += (k ? ", " : "") + checks[k];
      verdict += ")";
    }
    std::string cls = !t.pass() ? "fail" : t.unchecked ? "unchecked" : "pass";
    if (res.first_divergence == i) cls += " first";
    s += fmt::format(
        "<tr class=\"{}\" data-tap=\"{}\"><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\" title=\"{}\">{}</td><td class=\"l v\">{}</td></tr>\n",
        cls, esc(t.name), i, esc(t.name), esc(t.layout),
        t.nonfinite.nan + t.nonfinite.inf ? fmt::format("{} / {}", t.nonfinite.nan, t.nonfinite.inf) : "-",
        !t.replica.applies ? "n/a" : t.replica.differing.empty() ? "equal"
                                   : t.replica.by_hash ? "bits differ" : html::num(t.replica.max_abs),
        ref.present && !ref.estimated ? html::num(ref.max_abs) : ref.present ? "(sketch)" : "-",
        ref.present && !ref.estimated ? html::num(ref.max_rel) : "-",
        ref.present ? (ref.estimated ? "~" : "") + html::num(ref.rel_l2) : "-", ref.present ? html::num(ref.margin()) : "-",
        ref.present ? esc(tolerance_line(ref)) : "", ref.present ? esc(tolerance_cell(ref.tol)) : "-", esc(verdict));
  }
  s += "</tbody></table>\n";
  return s;
}

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
    out << html::page_begin(title);
    out << "<h1>" << esc(title) << " " << html::verdict_badge(res.pass(), !res.pass()                     ? "FAIL"
                                                   : res.unchecked_taps().empty() ? "PASS"
                                                   : fmt::format("PASS, {} unchecked", res.unchecked_taps().size()))
        << "</h1>\n<div class=\"meta\">" << meta << " &middot; " << res.taps.size() << " taps, " << failing
        << " failing</div>\n";
    if (!res.pass())
      out << "<pre id=\"first-divergence\">" << esc(describe_first_divergence(set, res)) << "</pre>\n";
    if (const auto unchecked = res.unchecked_taps(); !unchecked.empty())
      out << "<p id=\"unchecked\">" << esc(unchecked_sentence(unchecked)) << "</p>\n";
    else if (res.pass())
      out << "<p id=\"all-pass\">Every check of every tap passes.</p>\n";
    if (!res.tolerance_note.empty())
      out << "<p id=\"tolerance-note\">" << esc(res.tolerance_note) << "</p>\n";
    if (!res.tolerance_fallbacks.empty()) {
      std::string names;
      for (const auto& n : res.tolerance_fallbacks) names += (names.empty() ? "" : ", ") + n;
      out << fmt::format("<p id=\"tolerance-fallbacks\">{} tap(s) not in the tolerance table keep the derived "
                         "rule: {}</p>\n", res.tolerance_fallbacks.size(), esc(names));
    }
    // A pipeline's pictures first: its image, the steps, the error growth.
    if (!res.images.empty()) out << "<h2>Final image</h2>\n" << html::image_figures(res);
    if (const std::string steps = html::step_heatmap(res); !steps.empty()) {
      out << "<h2>Error over tolerance, per step and tap</h2>\n" << html::legend();
      out << "<div class=\"row\">" << steps << "</div>\n";
      out << "<h2>Error growth over steps</h2>\n" << html::error_growth(res);
    }
    out << "<h2>Error over tolerance, per tap and rank</h2>\n" << html::legend();
    out << "<div class=\"row\">" << heatmap(set, res) << "</div>\n";
    out << "<h2>Taps, in execution order</h2>\n" << tap_table(res);
    out << html::page_end();
  }
};

}  // namespace

std::unique_ptr<Reporter> make_html_reporter() { return std::make_unique<HtmlReporter>(); }

}  // namespace dc
