// The self-contained HTML report: one file with uPlot, its CSS and the data inlined (no URL, no
// request), drawn by a small script in the page. Curves in GiB (2^30 bytes) over time in ms.
#include <algorithm>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "export/assets.h"
#include "export/exports.h"

namespace memsim::exports {
namespace {

using json = nlohmann::json;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double Gib(Bytes b) { return static_cast<double>(b) / kGiB; }

// At most `max_points` samples: each bucket of consecutive samples keeps its maxima of the
// three curves and the category split of its allocated maximum (so the stack still sums to
// the allocated curve).
json StageJson(const RunDetail& d, int max_points) {
  const size_t n = d.samples.size();
  const size_t buckets = std::max<size_t>(1, std::min<size_t>(n, static_cast<size_t>(max_points)));
  json t = json::array(), alloc = json::array(), resv = json::array(), dev = json::array();
  json cats = json::array();
  for (int c = 0; c < kNumCategories; ++c) cats.push_back(json::array());
  for (size_t b = 0; b < buckets && n > 0; ++b) {
    const size_t lo = b * n / buckets, hi = std::max(lo + 1, (b + 1) * n / buckets);
    size_t at = lo;
    Bytes r = 0, v = 0;
    for (size_t i = lo; i < hi; ++i) {
      const CategorySample& s = d.samples[i];
      if (s.allocated_bytes > d.samples[at].allocated_bytes) at = i;
      r = std::max(r, s.reserved_bytes);
      v = std::max(v, s.device_bytes);
    }
    const CategorySample& s = d.samples[at];
    t.push_back(s.time_us / 1000.0);
    alloc.push_back(Gib(s.allocated_bytes));
    resv.push_back(Gib(r));
    dev.push_back(Gib(v));
    for (int c = 0; c < kNumCategories; ++c) cats[static_cast<size_t>(c)].push_back(Gib(s.by_category[c]));
  }
  json spans = json::array();
  for (const timeline::SpanSummary& s : d.spans) {
    spans.push_back({{"iteration", s.iteration},
                     {"start_ms", s.start_time_us / 1000.0},
                     {"end_ms", s.end_time_us / 1000.0},
                     {"peak_allocated", Gib(s.peak_allocated_bytes)},
                     {"peak_reserved", Gib(s.peak_reserved_bytes)},
                     {"peak_device", Gib(s.peak_device_bytes)},
                     {"start_allocated", Gib(s.start_allocated_bytes)},
                     {"end_allocated", Gib(s.end_allocated_bytes)},
                     {"peak_phase", PhaseName(s.peak_phase)},
                     {"peak_op", s.peak_op}});
  }
  return {{"rank", d.pipeline_rank}, {"t", t},         {"allocated", alloc}, {"reserved", resv},
          {"device", dev},           {"categories", cats}, {"spans", spans}};
}

json MeasuredJson(const MeasuredCurve& m, int max_points) {
  const auto& samples = m.timeline.samples;
  const size_t n = samples.size();
  const size_t step = std::max<size_t>(1, n / static_cast<size_t>(std::max(1, max_points)));
  json t = json::array(), alloc = json::array(), resv = json::array(), dev = json::array();
  auto value = [](Bytes b) { return b < 0 ? json(nullptr) : json(Gib(b)); };
  for (size_t i = 0; i < n; i += step) {
    t.push_back((samples[i].time_us + m.time_offset_us) / 1000.0);
    alloc.push_back(value(samples[i].allocated_bytes));
    resv.push_back(value(samples[i].reserved_bytes));
    dev.push_back(value(samples[i].device_bytes));
  }
  return {{"label", m.label}, {"t", t}, {"allocated", alloc}, {"reserved", resv}, {"device", dev}};
}

// Text inside <script> or <pre>: "</" could end the element; & and < in <pre> are escaped.
std::string ScriptSafe(std::string s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<' && i + 1 < s.size() && s[i + 1] == '/') {
      out += "<\\/";
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}
std::string HtmlEscape(std::string_view s) {
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

// uPlot's minified script opens with a banner comment holding the project's URL; the page keeps
// no URL, so the banner is replaced by one naming the version, and the licence follows.
std::string UplotScript() {
  std::string_view js = internal::UplotJs();
  if (js.substr(0, 3) == "/*!") {
    const size_t end = js.find("*/");
    if (end != std::string_view::npos) js.remove_prefix(end + 2);
  }
  std::string licence(internal::UplotLicense());
  std::string out = "/*! uPlot 1.6.32 (third_party/uplot), licence:\n" + licence + "*/\n";
  out += js;
  return ScriptSafe(out);
}

// The page's own script: stage selector, two synchronised charts (curves; stacked categories)
// with a mark where each iteration starts, iteration zoom, per-iteration table. Any error is shown
// on the page and in the console.
constexpr std::string_view kPageScript = R"js(
"use strict";
const errors = document.getElementById("errors");
window.addEventListener("error", e => { errors.textContent += String(e.message) + "\n"; });
const GiB = v => v == null ? "" : v.toFixed(2);
const colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                "#7f7f7f", "#bcbd22"];
let charts = [];
function width() { return Math.max(600, Math.min(1400, window.innerWidth - 40)); }
function curveChart(stage) {
  let data = [stage.t, stage.allocated, stage.reserved, stage.device];
  const series = [{label: "time (ms)"},
    {label: "allocated", stroke: "#1f77b4", width: 1.5, value: (u, v) => GiB(v)},
    {label: "reserved", stroke: "#ff7f0e", width: 1.5, value: (u, v) => GiB(v)},
    {label: "device (npu-smi / nvidia-smi)", stroke: "#2ca02c", width: 1.5, value: (u, v) => GiB(v)}];
  if (DATA.measured) {
    const m = DATA.measured;
    data = uPlot.join([data, [m.t, m.allocated, m.reserved, m.device]]);
    for (const [name, color] of [["allocated", "#1f77b4"], ["reserved", "#ff7f0e"], ["device", "#2ca02c"]]) {
      series.push({label: "measured " + name, stroke: color, dash: [6, 4], width: 1.5, spanGaps: true,
                   value: (u, v) => GiB(v)});
    }
  }
  return {data, series};
}
function stackChart(stage) {
  const n = stage.t.length, k = DATA.categories.length;
  const cum = [];
  let run = new Array(n).fill(0);
  for (let c = 0; c < k; c++) {
    run = run.map((v, i) => v + stage.categories[c][i]);
    cum.push(run);
  }
  // Drawn top down: each later (lower) band paints over the one above it.
  const data = [stage.t], series = [{label: "time (ms)"}];
  for (let c = k - 1; c >= 0; c--) {
    data.push(cum[c]);
    const raw = stage.categories[c];
    series.push({label: DATA.categories[c], stroke: colors[c], fill: colors[c] + "cc", width: 1,
                 value: (u, v, si, i) => i == null ? "" : GiB(raw[i])});
  }
  return {data, series};
}
// A dashed line and "it N" where each iteration starts (its span's start), on every chart.
function iterationMarks(stage) {
  return u => {
    const ctx = u.ctx, top = u.bbox.top, bottom = u.bbox.top + u.bbox.height;
    ctx.save();
    ctx.strokeStyle = "#888";
    ctx.fillStyle = "#555";
    ctx.lineWidth = 1;
    ctx.setLineDash([4, 4]);
    ctx.font = Math.round(10 * devicePixelRatio) + "px sans-serif";
    for (const s of stage.spans) {
      if (s.iteration === 0) continue;
      const x = Math.round(u.valToPos(s.start_ms, "x", true));
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, bottom);
      ctx.stroke();
      ctx.fillText("it " + s.iteration, x + 3, top + 12 * devicePixelRatio);
    }
    ctx.restore();
  };
}
function sync(u) {
  for (const other of charts) {
    if (other !== u) other.setScale("x", {min: u.scales.x.min, max: u.scales.x.max});
  }
}
function draw(index) {
  const stage = DATA.stages[index];
  for (const c of charts) c.destroy();
  charts = [];
  const common = {width: width(), height: 320, cursor: {sync: {key: "memsim"}},
                  scales: {x: {time: false}}, hooks: {setSelect: [u => setTimeout(() => sync(u), 0)],
                                                      draw: [iterationMarks(stage)]},
                  axes: [{label: "time (ms)"}, {label: "GiB"}]};
  const a = curveChart(stage), b = stackChart(stage);
  charts.push(new uPlot({...common, title: "allocated, reserved and device memory of pipeline stage " +
                         stage.rank, series: a.series}, a.data, document.getElementById("curves")));
  charts.push(new uPlot({...common, title: "allocated by category (stacked)", series: b.series}, b.data,
                        document.getElementById("stack")));
  const zoom = document.getElementById("zoom");
  zoom.innerHTML = "";
  zoom.add(new Option("whole run", ""));
  for (const s of stage.spans) zoom.add(new Option(s.iteration === 0 ? "init" : "iteration " + s.iteration, s.iteration));
  const body = document.querySelector("#spans tbody");
  body.innerHTML = "";
  for (const s of stage.spans) {
    const row = body.insertRow();
    for (const v of [s.iteration === 0 ? "init" : s.iteration, GiB(s.peak_allocated), GiB(s.peak_reserved),
                     GiB(s.peak_device), GiB(s.start_allocated), GiB(s.end_allocated),
                     s.peak_phase + (s.peak_op ? " " + s.peak_op : "")]) {
      row.insertCell().textContent = v;
    }
  }
}
const select = document.getElementById("stage");
DATA.stages.forEach((s, i) => select.add(new Option("pipeline stage " + s.rank, i)));
select.value = DATA.reported;
select.addEventListener("change", () => draw(Number(select.value)));
document.getElementById("zoom").addEventListener("change", e => {
  const stage = DATA.stages[Number(select.value)];
  const span = stage.spans.find(s => String(s.iteration) === e.target.value);
  const min = span ? span.start_ms : stage.t[0], max = span ? span.end_ms : stage.t[stage.t.length - 1];
  for (const c of charts) c.setScale("x", {min, max});
});
draw(DATA.reported);
document.body.dataset.ready = "1";
)js";

constexpr std::string_view kPageCss = R"css(
body { font-family: sans-serif; margin: 16px; color: #222; }
pre { font-size: 12px; background: #f6f6f6; padding: 8px; overflow-x: auto; }
#errors { color: #b00; background: none; padding: 0; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: right; }
.controls { margin: 8px 0; }
)css";

}  // namespace

std::string TitleOf(std::string_view header) {
  std::string_view line = header.substr(0, header.find('\n'));
  const size_t colon = line.find(": ");
  if (line.rfind("memsim ", 0) == 0 && colon != std::string_view::npos) line.remove_prefix(colon + 2);
  return std::string(line);
}

std::string HtmlReport(const HtmlInput& input, int max_points) {
  json data;
  data["stages"] = json::array();
  for (const RunDetail& d : input.stages) data["stages"].push_back(StageJson(d, max_points));
  data["reported"] = input.reported_stage;
  data["categories"] = json::array();
  for (int c = 0; c < kNumCategories; ++c) {
    data["categories"].push_back(CategoryName(static_cast<Category>(c)));
  }
  data["measured"] = input.measured ? MeasuredJson(*input.measured, max_points * 4) : json(nullptr);
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += fmt::format("<title>memsim: {}</title>\n", HtmlEscape(input.title));
  out += "<style>\n" + ScriptSafe(std::string(internal::UplotCss())) + "\n" +
         std::string(kPageCss) + "</style>\n</head>\n<body>\n";
  out += fmt::format("<h1>memsim: {}</h1>\n", HtmlEscape(input.title));
  out += "<pre id=\"errors\"></pre>\n";
  out += "<pre>" + HtmlEscape(input.header) + "</pre>\n";
  out += "<div class=\"controls\"><label>show <select id=\"stage\"></select></label> "
         "<label>zoom to <select id=\"zoom\"></select></label> (drag on a chart to zoom, "
         "double-click to reset)</div>\n";
  out += "<div id=\"curves\"></div>\n<div id=\"stack\"></div>\n";
  out += "<table id=\"spans\"><thead><tr><th>iteration</th><th>peak allocated</th>"
         "<th>peak reserved</th><th>peak device</th><th>start allocated</th>"
         "<th>end allocated</th><th>allocated peak at</th></tr></thead><tbody></tbody></table>\n"
         "<p>GiB = 2<sup>30</sup> bytes.</p>\n";
  out += "<pre>" + HtmlEscape(input.table) + "</pre>\n";
  out += "<script>\n" + UplotScript() + "\n</script>\n";
  out += "<script>\nconst DATA = " + ScriptSafe(data.dump()) + ";\n" + std::string(kPageScript) +
         "</script>\n</body>\n</html>\n";
  return out;
}

}  // namespace memsim::exports
