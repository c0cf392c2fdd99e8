#include "harness/report/html_pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "harness/report/html.h"
#include "harness/report/png.h"
#include "harness/report/steps.h"

namespace dc::html {
namespace {

struct StepTap {
  std::size_t index;  // into res.taps
  std::string step, rest;
};

std::vector<StepTap> step_taps(const CompareResult& res) {
  std::vector<StepTap> out;
  for (std::size_t i = 0; i < res.taps.size(); ++i)
    if (const auto name = split_step(res.taps[i].name)) out.push_back({i, name->step, name->rest});
  return out;
}

}  // namespace

std::string step_heatmap(const CompareResult& res) {
  const auto steps = summarize_steps(res);
  if (steps.size() < 2) return "";
  const auto taps = step_taps(res);
  std::vector<std::string> columns;  // tap names below the step, in order of first appearance
  std::map<std::string, std::size_t> column_of, row_of;
  for (const auto& t : taps)
    if (column_of.emplace(t.rest, columns.size()).second) columns.push_back(t.rest);
  for (std::size_t i = 0; i < steps.size(); ++i) row_of[steps[i].step] = i;
  // Room above for the rotated tap names, and to the right for the last ones.
  const int cw = 18, ch = 14, left = 70, top = 110;
  const int width = left + int(columns.size()) * cw + 90, height = top + int(steps.size()) * ch + 10;
  std::string s = fmt::format(
      "<svg id=\"step-heatmap\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" role=\"img\" "
      "aria-label=\"error over tolerance per step and tap\">\n",
      width, height);
  for (std::size_t c = 0; c < columns.size(); ++c)
    s += fmt::format("<text class=\"rank-label\" transform=\"translate({},{}) rotate(-60)\">{}</text>\n",
                     left + int(c) * cw + cw / 2, top - 6, esc(columns[c]));
  for (std::size_t r = 0; r < steps.size(); ++r)
    s += fmt::format("<text class=\"tap-label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", left - 6,
                     top + int(r) * ch + ch - 3, esc(steps[r].step));
  for (const auto& t : taps) {
    const TapVerdict& v = res.taps[t.index];
    CellState c;
    c.nonfinite = v.nonfinite.nan + v.nonfinite.inf;
    if (!v.replica.pass) c.replica = v.replica.max_abs;
    c.ratio = worst_err_over_tol(v);
    std::string kind;
    const std::string fill = html::fill(c, kind);
    const bool first = res.first_divergence == t.index;
    const int x = left + int(column_of[t.rest]) * cw, y = top + int(row_of[t.step]) * ch;
    s += fmt::format(
        "<rect class=\"cell {}{}\" data-tap=\"{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"{}>"
        "<title>{}: err/tol {}{}</title></rect>\n",
        kind, first ? " first" : "", esc(v.name), x, y, cw - 1, ch - 1, fill,
        first ? " stroke=\"#000\" stroke-width=\"2\"" : "", esc(v.name), num(c.ratio),
        v.pass() ? "" : " (fails)");
  }
  s += "</svg>\n";
  return s;
}

std::string error_growth(const CompareResult& res) {
  const auto steps = summarize_steps(res);
  if (steps.size() < 2) return "";
  // One value per step: rel L2 of latents_out when the steps have it.
  std::vector<double> ys(steps.size(), NAN);
  bool rel_l2 = false;
  std::map<std::string, std::size_t> row_of;
  for (std::size_t i = 0; i < steps.size(); ++i) row_of[steps[i].step] = i;
  for (const auto& t : step_taps(res))
    if (t.rest == "latents_out" && res.taps[t.index].reference.present) {
      ys[row_of[t.step]] = res.taps[t.index].reference.rel_l2;
      rel_l2 = true;
    }
  if (!rel_l2)
    for (std::size_t i = 0; i < steps.size(); ++i) ys[i] = steps[i].worst_ratio;
  double lo = INFINITY, hi = 0;
  for (double y : ys)
    if (std::isfinite(y) && y > 0) lo = std::min(lo, y), hi = std::max(hi, y);
  if (!(hi > 0)) return "<p id=\"error-growth\">No error to plot: every step matches its reference exactly.</p>\n";
  const double l0 = std::floor(std::log10(lo)), l1 = std::max(l0 + 1, std::ceil(std::log10(hi)));
  const int w = 520, h = 220, left = 60, right = 10, top = 10, bottom = 30;
  auto px = [&](std::size_t i) { return left + double(i) * (w - left - right) / double(ys.size() - 1); };
  auto py = [&](double y) { return top + (l1 - std::log10(y)) / (l1 - l0) * (h - top - bottom); };
  std::string s = fmt::format(
      "<svg id=\"error-growth\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" role=\"img\" "
      "aria-label=\"{} over steps\">\n",
      w, h, rel_l2 ? "rel L2 of the latents" : "worst err/tol");
  for (double e = l0; e <= l1; ++e)
    s += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.1f}\" "
                     "class=\"axis\" text-anchor=\"end\">1e{}</text>\n",
                     left, w - right, py(std::pow(10, e)), py(std::pow(10, e)), left - 4, py(std::pow(10, e)) + 4,
                     int(e));
  std::string points;
  for (std::size_t i = 0; i < ys.size(); ++i)
    if (std::isfinite(ys[i]) && ys[i] > 0) points += fmt::format("{:.1f},{:.1f} ", px(i), py(ys[i]));
  s += fmt::format("<polyline fill=\"none\" stroke=\"#c0392b\" stroke-width=\"2\" points=\"{}\"/>\n", points);
  for (std::size_t i = 0; i < ys.size(); ++i)
    if (std::isfinite(ys[i]) && ys[i] > 0)
      s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"#c0392b\"><title>{}: {}</title></circle>\n",
                       px(i), py(ys[i]), esc(steps[i].step), num(ys[i]));
  s += fmt::format("<text x=\"{}\" y=\"{}\" class=\"axis\">step &#8594; ({} .. {})</text>\n", left, h - 8,
                   esc(steps.front().step), esc(steps.back().step));
  s += "</svg>\n";
  return s;
}

std::string image_figures(const CompareResult& res) {
  std::string s;
  for (const auto& im : res.images) {
    // Scaled so that a small image is still seen: about 256 pixels wide.
    const std::size_t scale = std::max<std::size_t>(1, 256 / std::max<std::size_t>(im.width, 1));
    std::vector<double> diff(im.image.size());
    double worst = 0;
    for (std::size_t i = 0; i < diff.size(); ++i) {
      diff[i] = std::abs(im.image[i] - im.reference[i]);
      if (std::isfinite(diff[i])) worst = std::max(worst, diff[i]);
    }
    // |difference| stretched so that the largest is white: its scale is shown.
    const double amp = worst > 0 ? im.data_range / worst : 1.0;
    auto img = [&](const std::vector<double>& v, double low, double range, const char* cls, const std::string& caption) {
      return fmt::format("<figure class=\"{}\"><img alt=\"{}\" src=\"{}\" width=\"{}\" height=\"{}\"/><figcaption>{}"
                         "</figcaption></figure>",
                         cls, esc(caption), png_data_uri(v, im.width, im.height, im.channels, low, range, scale),
                         im.width * scale, im.height * scale, esc(caption));
    };
    s += fmt::format("<div class=\"images\" data-tap=\"{}\" data-item=\"{}\">\n<h3>{} (item {}): PSNR {:.2f} dB, SSIM "
                     "{:.4f} &mdash; an image gate (SSIM &ge; {:.2f}, PSNR &ge; {:.0f}) would {}</h3>\n",
                     esc(im.tap), im.item, esc(im.tap), im.item, im.psnr, im.ssim, kGateSsim, kGatePsnr,
                     html::verdict_badge(im.gate_pass, im.gate_pass ? "PASS it" : "FAIL it"));
    s += img(im.reference, im.data_low, im.data_range, "reference", "reference") + "\n";
    s += img(im.image, im.data_low, im.data_range, "result", "this run") + "\n";
    s += img(diff, 0.0, worst > 0 ? worst : 1.0, "difference",
             fmt::format("|difference| x {} (white = {})", num(amp), num(worst))) + "\n</div>\n";
  }
  return s;
}

}  // namespace dc::html
