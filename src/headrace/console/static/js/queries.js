// Every statement the console runs, in one place. Each reads a system relation, SHOW or pg_catalog: nothing
// private. Where a newer relation may not exist on this server, `firstAvailable` tries the newer one first
// and falls back to what older servers have (or reports the part as not available).

import { isMissing, quoteIdent, quoteLiteral } from "./sql.js";

export async function firstAvailable(sql, candidates) {
  let last = null;
  for (const candidate of candidates) {
    const result = await sql.query(candidate);
    if (!isMissing(result.error)) return { ...result, query: candidate };
    last = result;
  }
  return { ...last, missing: true };
}

export const OBJECT_LISTS = {
  sources: "SHOW SOURCES",
  views: "SHOW MATERIALIZED VIEWS",
  sinks: "SHOW SINKS",
  indexes: "SHOW INDEXES",
  secrets: "SHOW SECRETS", // names only: no relation holds a secret's value
  connections: "SHOW CONNECTIONS",
  // headrace's tables and the store's own are public relations of kind 'r' that are not sources
  relations: "SELECT c.relname AS name, c.relkind AS kind FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n " +
    "ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') ORDER BY 1",
};

// Every object with its SQL and what it reads, when the server has these relations (else SHOW, above).
export const OBJECTS = ["SELECT schema, name, kind, owner, definition FROM headrace_internal.objects ORDER BY kind, schema, name"];
export const DEPENDENCIES = ["SELECT schema, name, kind, referenced_schema, referenced_name, referenced_kind " +
  "FROM headrace_internal.object_dependencies"];

export function viewDefinition(name) {
  return `SHOW CREATE MATERIALIZED VIEW ${quoteIdent(name)}`;
}

export function columnsOf(name) {
  return "SELECT column_name, data_type, is_nullable FROM information_schema.columns WHERE table_schema = 'public' " +
    `AND table_name = ${quoteLiteral(name)} ORDER BY ordinal_position`;
}

export const WEBHOOK_COUNTERS = "SELECT * FROM headrace_internal.webhook_counters ORDER BY database, schema, source";

export function webhookRequests(source, limit = 50) {
  return `SELECT received_at, status, reason, size_bytes, rows, latency_ms FROM headrace_internal.webhook_requests ` +
    `WHERE source = ${quoteLiteral(source)} ORDER BY received_at DESC LIMIT ${limit}`;
}

export const PIPELINE = "SELECT * FROM headrace_internal.pipeline_status";
export const SOURCE_STATUS = "SELECT * FROM headrace_internal.source_status ORDER BY source";
export const SINK_STATUS = "SELECT * FROM headrace_internal.sink_status ORDER BY schema, name";
export const VIEW_ERRORS = "SELECT view_schema, view_name, count(*) AS errors, min(since) AS since, " +
  "min(sqlstate || ': ' || message) AS example FROM headrace_internal.view_errors GROUP BY 1, 2 ORDER BY 1, 2";
// One row per materialization (source, table, view, sink): state, positions, lag, freshness, last error and retries,
// when the server has it (else source_status and sink_status, above).
export const MATERIALIZATIONS = ["SELECT materialization, kind, schema, name, transaction_of, state, transactions, " +
  "failures, attempts, restarts, committed_position, log_position, lag_bytes, lag_transactions, lag_seconds, " +
  "last_commit_at, freshness_seconds, last_error, last_error_at, next_retry_at FROM headrace_internal.materializations " +
  "ORDER BY CASE kind WHEN 'source' THEN 0 WHEN 'table' THEN 1 WHEN 'view' THEN 2 ELSE 3 END, schema, name"];
export const QUARANTINED = "SELECT source, count(*) AS records, max(quarantined_at) AS last FROM " +
  "headrace_internal.quarantined_records GROUP BY source ORDER BY source";
