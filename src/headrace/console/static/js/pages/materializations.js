// Materializations (each source's and table's pipeline query, the views maintained in its transactions, each sink):
// state, freshness and lag over the last hour as a small chart (sampled by this page), last error, and progress
// where a relation reports it (a backfill, a sink's snapshot).

import { h, replace, table, badge, number, bytes, seconds, parseTimestamp, ago, unavailable } from "../dom.js";
import { PIPELINE, SOURCE_STATUS, SINK_STATUS, VIEW_ERRORS, MATERIALIZATIONS, QUARANTINED, firstAvailable } from "../queries.js";
import { chart, record } from "../chart.js";

const sinceSeconds = (text) => {
  const at = parseTimestamp(text);
  return at === null ? null : Math.max(0, (Date.now() - at) / 1000);
};
const FRESHNESS = { key: "freshness", label: "since last commit", class: "freshness" };
const LAG = { key: "lag", label: "lag", class: "lag" };

export function materializationsPage(root, sql) {
  const pipeline = h("div", { id: "pipeline" });
  const unified = h("div", { id: "materializations" });
  const sources = h("div", { id: "source-materializations" });
  const views = h("div", { id: "view-materializations" });
  const sinks = h("div", { id: "sink-materializations" });
  replace(root, h("h1", {}, "Materializations"), pipeline, unified, sources, views, sinks);

  async function refresh() {
    const [process, all, sourceRows, sinkRows, viewErrors, quarantined] = await Promise.all([
      sql.query(PIPELINE), firstAvailable(sql, MATERIALIZATIONS), sql.query(SOURCE_STATUS), sql.query(SINK_STATUS),
      sql.query(VIEW_ERRORS), sql.query(QUARANTINED)]);
    renderPipeline(process);
    const setAside = new Map((quarantined.rows || []).map((row) => [row.source, row]));
    renderViewErrors(viewErrors);
    if (!all.missing) {
      replace(unified, all.error ? unavailable("headrace_internal.materializations", all.error)
        : materializationTable(all.rows, setAside));
      replace(sources);
      replace(sinks);
      return;
    }
    replace(unified);
    renderSources(sourceRows, setAside);
    renderSinks(sinkRows);
  }

  function renderSources(sourceRows, setAside) {
    replace(sources, h("h2", {}, "Sources and tables"), sourceRows.error ? unavailable("headrace_internal.source_status", sourceRows.error) : table([
      { label: "source", cell: (row) => row.source },
      { label: "state", cell: (row) => h("span", {}, badge(row.state), progressOf(row)) },
      { label: "last commit", cell: (row) => ago(row.last_batch_at) },
      { label: "failures", class: "num", cell: (row) => number(row.failures) },
      { label: "quarantined", class: "num", cell: (row) => number(setAside.get(row.source)?.records ?? 0) },
      { label: "freshness, last hour", cell: (row) => chart(record(`source:${row.source}`,
        { freshness: sinceSeconds(row.last_batch_at) }), [FRESHNESS]) },
      { label: "last error", class: "error-cell", cell: (row) => lastError(row) },
    ], sourceRows.rows, { empty: "No source or table is materialized yet.",
      rowAttrs: (row) => ({ "data-materialization": row.source, "data-state": row.state }) }));
  }

  function renderViewErrors(viewErrors) {
    replace(views, h("h2", {}, "Rows views cannot compute"), viewErrors.error ? unavailable("headrace_internal.view_errors", viewErrors.error) : h("div", {},
      h("p", { class: "muted" }, "A materialized view is maintained in the transactions of the source or table it reads: " +
        "its freshness is that source's. Input rows a view cannot compute (and leaves out) are listed here."),
      table([
        { label: "view", cell: (row) => `${row.view_schema}.${row.view_name}` },
        { label: "rows in error", class: "num", cell: (row) => number(row.errors) },
        { label: "since", cell: (row) => ago(row.since) },
        { label: "first error", class: "error-cell", cell: (row) => row.example },
      ], viewErrors.rows, { empty: "No view holds an error." })));
  }

  function renderSinks(sinkRows) {
    replace(sinks, h("h2", {}, "Sinks"), sinkRows.error ? unavailable("headrace_internal.sink_status", sinkRows.error) : table([
      { label: "sink", cell: (row) => row.name },
      { label: "from", cell: (row) => row.relation },
      { label: "driver", cell: (row) => row.driver },
      { label: "state", cell: (row) => h("span", {}, badge(row.state), progressOf(row)) },
      { label: "committed", cell: (row) => ago(row.committed_at) },
      { label: "lag", class: "num", cell: (row) => `${number(row.lag_transactions)} txn, ${seconds(Number(row.lag_seconds))}` },
      { label: "documents", class: "num", cell: (row) => number(row.documents) },
      { label: "freshness and lag, last hour", cell: (row) => chart(record(`sink:${row.name}`,
        { freshness: sinceSeconds(row.committed_at), lag: Number(row.lag_seconds) }), [FRESHNESS, LAG]) },
      { label: "last error", class: "error-cell", cell: (row) => lastError(row) },
    ], sinkRows.rows, { empty: "No sink yet.", rowAttrs: (row) => ({ "data-sink": row.name, "data-state": row.state }) }));
  }

  function renderPipeline(process) {
    if (process.error) return replace(pipeline, unavailable("headrace_internal.pipeline_status", process.error));
    const row = process.rows[0] || {};
    replace(pipeline, h("p", { class: "pipeline" }, "Pipeline ", badge(row.state), ` on ${row.spark_master ?? "?"}`,
      `, ${number(row.restarts)} restarts`, row.started_at ? `, started ${ago(row.started_at)}` : "",
      row.last_error ? h("span", { class: "error-text" }, ` — last error ${ago(row.last_error_at)}: ${row.last_error}`) : ""));
  }

  return { refresh, interval: 3000 };
}

function lastError(row) {
  if (!row.last_error) return "";
  return h("span", { class: "error-text", "data-error": "" }, `${ago(row.last_error_at)}: ${row.last_error}`);
}

// A progress bar where the row reports one: `progress` (0 to 1) or `progress_done` of `progress_total`.
export function progressOf(row) {
  let fraction = null;
  if (row.progress !== undefined && row.progress !== null) fraction = Number(row.progress);
  else if (row.progress_total) fraction = Number(row.progress_done ?? 0) / Number(row.progress_total);
  if (fraction === null || !Number.isFinite(fraction)) return null;
  const percent = Math.max(0, Math.min(100, fraction * 100));
  return h("span", { class: "progress", "data-progress": percent.toFixed(1) },
    h("progress", { max: 100, value: percent.toFixed(1) }), ` ${percent.toFixed(0)}%`,
    row.progress_total ? ` (${number(row.progress_done)} of ${number(row.progress_total)})` : "");
}

// headrace_internal.materializations: every source, table, view and sink in one table.
function materializationTable(rows, setAside) {
  return table([
    { label: "materialization", cell: (row) => h("span", {}, `${row.schema}.${row.name}`, h("span", { class: "muted" }, ` ${row.kind}`)) },
    { label: "state", cell: (row) => h("span", {}, badge(row.state), catchUp(row)) },
    { label: "last commit", cell: (row) => ago(row.last_commit_at) },
    { label: "lag", class: "num", cell: (row) => lagText(row) },
    { label: "transactions", class: "num", cell: (row) => number(row.transactions) },
    { label: "freshness and lag, last hour", cell: (row) => chart(record(`${row.kind}:${row.schema}.${row.name}`,
      { freshness: numberOrNull(row.freshness_seconds), lag: numberOrNull(row.lag_seconds) }), [FRESHNESS, LAG]) },
    { label: "last error", class: "error-cell", cell: (row) => h("span", {}, lastError(row), retries(row),
      setAside.get(`${row.schema}.${row.name}`) ? h("div", { class: "muted" },
        `${number(setAside.get(`${row.schema}.${row.name}`).records)} records quarantined`) : null) },
  ], rows, { empty: "Nothing is materialized yet.", rowAttrs: (row) => ({
    "data-materialization": `${row.schema}.${row.name}`, "data-kind": row.kind, "data-state": row.state,
    "data-sink": row.kind === "sink" ? row.name : null }) });
}

function numberOrNull(value) {
  return value === null || value === undefined ? null : Number(value);
}

function lagText(row) {
  const pending = row.kind === "sink" ? `${number(row.lag_transactions)} txn` : `${bytes(row.lag_bytes)} of log`;
  return `${pending}, ${seconds(numberOrNull(row.lag_seconds))}`;
}

function retries(row) {
  if (!row.next_retry_at && !Number(row.attempts)) return null;
  return h("div", { class: "muted", "data-retry": "" }, `attempt ${number(row.attempts)}`,
    row.next_retry_at ? `, next retry at ${row.next_retry_at}` : "");
}

// A source's, table's or view's progress through its log (a backfill, or catching up after a burst): the committed
// log position of the log's end, while it lags.
function catchUp(row) {
  const end = Number(row.log_position);
  if (row.kind === "sink" || !Number(row.lag_bytes) || !(end > 0)) return null;
  return progressOf({ progress: Number(row.committed_position ?? 0) / end });
}
