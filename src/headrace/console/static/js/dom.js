// DOM helpers. Values always go in as text nodes (textContent), never as HTML: names, SQL and error messages
// come from users and senders.

export function h(tag, attrs = {}, ...children) {
  const svg = ["svg", "polyline", "line", "text", "rect", "path", "g", "title"].includes(tag);
  const node = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "class") node.setAttribute("class", value);
    else if (name === "value" && !svg) node.value = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function replace(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

export function table(columns, rows, { empty = "none", rowAttrs } = {}) {
  if (!rows.length) return h("p", { class: "muted" }, empty);
  return h("table", { class: "grid" },
    h("thead", {}, h("tr", {}, columns.map((column) => h("th", {}, column.label ?? column)))),
    h("tbody", {}, rows.map((row) => h("tr", rowAttrs ? rowAttrs(row) : {},
      columns.map((column) => h("td", { class: column.class }, column.cell ? column.cell(row) : cellText(row[column])))))));
}

export function cellText(value) {
  if (value === null || value === undefined) return h("span", { class: "null" }, "NULL");
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

export function badge(state) {
  const kind = { running: "ok", ok: "ok", starting: "warn", backfilling: "warn", snapshotting: "warn", retrying: "bad",
    failing: "bad", failed: "bad", stalled: "bad", restarting: "bad", fenced: "bad", stopped: "muted" }[state] || "muted";
  return h("span", { class: `badge ${kind}`, "data-state": state ?? "" }, state ?? "unknown");
}

export function number(value) {
  if (value === null || value === undefined || value === "") return "–";
  const parsed = Number(value);
  return Number.isFinite(parsed) ? parsed.toLocaleString("en-US") : String(value);
}

export function bytes(value) {
  const parsed = Number(value);
  if (value === null || value === undefined || !Number.isFinite(parsed)) return "–";
  if (parsed < 1024) return `${parsed} B`;
  if (parsed < 1 << 20) return `${(parsed / 1024).toFixed(1)} KiB`;
  return `${(parsed / (1 << 20)).toFixed(1)} MiB`;
}

export function seconds(value) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "–";
  if (value < 1) return `${Math.round(value * 1000)} ms`;
  if (value < 120) return `${value.toFixed(1)} s`;
  if (value < 7200) return `${Math.round(value / 60)} min`;
  return `${(value / 3600).toFixed(1)} h`;
}

// PostgreSQL's timestamptz text ("2026-11-28 11:38:54.818937+00") as milliseconds since the epoch.
export function parseTimestamp(text) {
  if (!text) return null;
  const iso = String(text).replace(" ", "T").replace(/([+-]\d\d)$/, "$1:00");
  const parsed = Date.parse(iso);
  return Number.isFinite(parsed) ? parsed : null;
}

export function ago(text) {
  const at = parseTimestamp(text);
  return at === null ? "–" : `${seconds(Math.max(0, (Date.now() - at) / 1000))} ago`;
}

export function unavailable(what, error) {
  return h("p", { class: "unavailable", "data-unavailable": what },
    `${what}: not available on this server`, error ? ` (${error.code ?? ""} ${error.message})` : "");
}

export function errorBox(error) {
  return h("p", { class: "error" }, `${error.code ? error.code + ": " : ""}${error.message}`,
    error.detail ? h("span", { class: "detail" }, ` ${error.detail}`) : null);
}
