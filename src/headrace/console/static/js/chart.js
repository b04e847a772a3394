// Samples of a materialization's freshness and lag over the last hour, kept in the tab's sessionStorage (so a
// reload or another page keeps them), drawn as a small inline SVG chart.

import { h, seconds } from "./dom.js";

const KEY = "headrace.console.samples";
const WINDOW_MS = 3600 * 1000;
const MIN_INTERVAL_MS = 4000; // the page refreshes more often than the chart needs

function load() {
  try {
    return JSON.parse(sessionStorage.getItem(KEY)) || {};
  } catch {
    return {};
  }
}

export function record(name, values) {
  const all = load();
  const now = Date.now();
  const series = (all[name] || []).filter((sample) => now - sample.t <= WINDOW_MS);
  if (!series.length || now - series[series.length - 1].t >= MIN_INTERVAL_MS) series.push({ t: now, ...values });
  all[name] = series;
  for (const other of Object.keys(all)) {
    if (!all[other].length || now - all[other][all[other].length - 1].t > WINDOW_MS) delete all[other];
  }
  sessionStorage.setItem(KEY, JSON.stringify(all));
  return series;
}

export function samples(name) {
  return load()[name] || [];
}

// A line per field of `series` (freshness, lag) over the last hour; the y axis from 0 to the largest value.
export function chart(series, fields, { width = 280, height = 64 } = {}) {
  const now = Date.now();
  const values = series.flatMap((sample) => fields.map((field) => sample[field.key])).filter(Number.isFinite);
  const top = Math.max(1, ...values);
  const x = (t) => (width * (WINDOW_MS - (now - t))) / WINDOW_MS;
  const y = (v) => height - 12 - ((height - 16) * v) / top;
  const lines = fields.map((field) => {
    const points = series.filter((sample) => Number.isFinite(sample[field.key]))
      .map((sample) => `${x(sample.t).toFixed(1)},${y(sample[field.key]).toFixed(1)}`);
    if (points.length === 1) points.unshift(`${(Number(points[0].split(",")[0]) - 3).toFixed(1)},${points[0].split(",")[1]}`);
    return points.length ? h("polyline", { class: `line ${field.class}`, points: points.join(" "), fill: "none" }) : null;
  });
  const latest = series[series.length - 1] || {};
  return h("div", { class: "chart" },
    h("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", class: "spark" },
      h("title", {}, fields.map((field) => `${field.label} over the last hour`).join(", ")),
      h("line", { class: "axis", x1: 0, y1: height - 12, x2: width, y2: height - 12 }),
      h("text", { class: "tick", x: 0, y: height - 1 }, "1 h ago"),
      h("text", { class: "tick", x: width - 22, y: height - 1 }, "now"),
      h("text", { class: "tick", x: 2, y: 9 }, fields[0].format ? fields[0].format(top) : seconds(top)),
      lines),
    h("div", { class: "legend" }, fields.map((field) => h("span", { class: `key ${field.class}` },
      `${field.label}: ${field.format ? field.format(latest[field.key]) : seconds(latest[field.key])}`))));
}
