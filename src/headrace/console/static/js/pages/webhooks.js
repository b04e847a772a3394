// Webhook sources: URL, request rate, accepted / duplicate / replaced / rejected by reason, the last requests with
// their status and reason, and a form that sends a test request.

import { h, replace, table, number, unavailable, errorBox } from "../dom.js";
import { WEBHOOK_COUNTERS, webhookRequests } from "../queries.js";

const REASONS = ["invalid_body", "method_not_allowed", "too_large", "overloaded", "unavailable"];
const previous = new Map(); // source -> { t, received }: the request rate is measured between two refreshes

function webhookPath(row) {
  return `/api/webhook/${[row.database, row.schema, row.source].map(encodeURIComponent).join("/")}`;
}

function rateOf(row) {
  const now = performance.now();
  const received = Number(row.received);
  const last = previous.get(row.source);
  previous.set(row.source, { t: now, received, rate: last?.rate ?? null });
  if (!last || now - last.t < 500) return last?.rate ?? null;
  const rate = (Math.max(0, received - last.received) * 1000) / (now - last.t);
  previous.get(row.source).rate = rate;
  return rate;
}

function rateText(rate) {
  return rate === null || rate === undefined ? "measuring…" : `${rate.toFixed(rate < 10 ? 1 : 0)} req/s`;
}

export function webhooksPage(root, sql) {
  const body = h("div", {});
  replace(root, h("h1", {}, "Webhook sources"), body);

  async function refresh() {
    const counters = await sql.query(WEBHOOK_COUNTERS);
    if (counters.error) return replace(body, unavailable("headrace_internal.webhook_counters", counters.error));
    replace(body, table([
      { label: "source", cell: (row) => h("a", { href: `#/webhooks/${encodeURIComponent(row.source)}`, class: "source-link" }, row.source) },
      { label: "URL", cell: (row) => h("code", {}, location.origin + webhookPath(row)) },
      { label: "rate", cell: (row) => rateText(rateOf(row)) },
      { label: "received", class: "num", cell: (row) => number(row.received) },
      { label: "accepted", class: "num", cell: (row) => number(row.accepted) },
      { label: "rejected", class: "num", cell: (row) => number(row.rejected) },
    ], counters.rows, { empty: "No webhook source yet: CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON (in the SQL editor)." }));
  }
  return { refresh, interval: 3000 };
}

export function webhookSourcePage(root, sql, name) {
  const summary = h("div", { id: "webhook-summary" });
  const requests = h("div", { id: "webhook-requests" });
  replace(root, h("p", {}, h("a", { href: "#/webhooks" }, "← all webhook sources")), h("h1", {}, `Webhook source ${name}`),
    summary, testForm(name, () => refresh()), h("h2", {}, "Last requests"), requests);
  let source = null;

  async function refresh() {
    const [counters, recent] = await Promise.all([sql.query(WEBHOOK_COUNTERS), sql.query(webhookRequests(name))]);
    if (counters.error) return replace(summary, unavailable("headrace_internal.webhook_counters", counters.error));
    source = counters.rows.find((row) => row.source === name);
    if (!source) return replace(summary, h("p", { class: "error" }, `No webhook source named ${name}.`));
    replace(summary,
      h("p", {}, "URL: ", h("code", { id: "webhook-url" }, location.origin + webhookPath(source))),
      h("dl", { class: "figures" },
        figure("request rate", rateText(rateOf(source)), "rate"),
        figure("received", number(source.received), "received"),
        figure("accepted", number(source.accepted), "accepted"),
        figure("new rows", number(source.rows_new), "rows_new"),
        figure("duplicate rows", number(source.rows_duplicate), "rows_duplicate"),
        figure("replaced rows", number(source.rows_replaced), "rows_replaced"),
        figure("rejected", number(source.rejected), "rejected"),
        figure("ack p50", source.ack_latency_p50_ms === null ? "–" : `≤ ${source.ack_latency_p50_ms} ms`, "p50"),
        figure("ack p99", source.ack_latency_p99_ms === null ? "–" : `≤ ${source.ack_latency_p99_ms} ms`, "p99")),
      h("h2", {}, "Rejected by reason"),
      table([{ label: "reason", cell: (row) => row.reason }, { label: "requests", class: "num", cell: (row) => number(row.count) }],
        REASONS.map((reason) => ({ reason, count: source[`rejected_${reason}`] })), {
          rowAttrs: (row) => ({ "data-reason": row.reason }) }));
    replace(requests, recent.error ? unavailable("headrace_internal.webhook_requests", recent.error) : table([
      { label: "received at", cell: (row) => row.received_at },
      { label: "status", cell: (row) => h("span", { class: Number(row.status) === 200 ? "ok-text" : "bad-text" }, row.status) },
      { label: "reason", cell: (row) => row.reason ?? "" },
      { label: "bytes", class: "num", cell: (row) => number(row.size_bytes) },
      { label: "rows", class: "num", cell: (row) => number(row.rows) },
      { label: "latency", class: "num", cell: (row) => `${Number(row.latency_ms).toFixed(2)} ms` },
    ], recent.rows, { empty: "No request yet.", rowAttrs: (row) => ({ class: "request", "data-status": row.status }) }));
  }
  return { refresh, interval: 3000 };
}

function figure(label, value, key) {
  return h("div", { class: "figure", "data-figure": key }, h("dt", {}, label), h("dd", {}, value));
}

// POSTs to the source's webhook URL from the page, as a sender would (same origin: no credentials involved).
function testForm(name, after) {
  const headers = h("textarea", { id: "test-headers", rows: 3, spellcheck: "false" },
    "Content-Type: application/json\nIdempotency-Key: test-1");
  const bodyInput = h("textarea", { id: "test-body", rows: 4, spellcheck: "false" }, '{"hello": "world"}');
  const outcome = h("p", { id: "test-outcome", class: "muted" });
  async function send(event) {
    event.preventDefault();
    const sent = {};
    for (const line of headers.value.split("\n")) {
      const at = line.indexOf(":");
      if (at > 0) sent[line.slice(0, at).trim()] = line.slice(at + 1).trim();
    }
    try {
      const response = await fetch(`/api/webhook/headrace/public/${encodeURIComponent(name)}`,
        { method: "POST", headers: sent, body: bodyInput.value, credentials: "omit" });
      const text = await response.text();
      replace(outcome, h("span", { class: response.ok ? "ok-text" : "bad-text", "data-status": response.status },
        `${response.status} ${response.statusText}`), text ? ` — ${text}` : "");
    } catch (error) {
      replace(outcome, errorBox({ message: String(error) }));
    }
    after();
  }
  return h("details", { class: "test-request", open: true }, h("summary", {}, "Send a test request"),
    h("form", { onsubmit: send },
      h("label", {}, "Headers (one per line)", headers), h("label", {}, "Body", bodyInput),
      h("button", { type: "submit", id: "test-send" }, "POST"), outcome));
}
