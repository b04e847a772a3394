"""Quarantine: a log record the store refuses is set aside instead of failing its batch again at every retry.

Ingest refuses such rows with 400 (webhook/store_rules.py), but a log may hold records written before those rules
existed, or by a version with other rules. Before each micro-batch is materialized, its records are checked by the
same rules the store applies (`refused_records`); a refused record is:
- kept in the log (nothing is rewritten);
- left out of the source's rows and of every view over it (SourceBatches filters it from the batch and from the
  DataFrame the views are computed on; backfills skip it: pipeline/view_changes.py);
- listed in `headrace_internal.quarantined_records` with its source, log offset, arrival time, SQLSTATE and reason.

Durable and exactly once: the batch's quarantined records ride in its runtime checkpoint (`QUARANTINE_FIELD`), and
the serving driver records them in the same DuckDB transaction as the batch's rows and checkpoint
(store/quarantine.py `record_quarantined`, called by materialize/drivers/serving.py), keyed by (source, log offset).
A batch replayed after a kill -9 either finds its transaction committed (skipped whole) or commits it then; the
rules are a pure function of the log's bytes, so a replay quarantines the same records, and a record seen twice is
recorded once.

A replacement (a record naming `prev_offset`) that is quarantined replaces nothing: the row it would have replaced
stays, as if the refused request had never been acknowledged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from headrace.catalog.items import WebhookSource
from headrace.store.quarantine import QUARANTINE_FIELD, QUARANTINE_SOURCE_FIELD  # noqa: F401 - the checkpoint's fields
from headrace.webhook.store_rules import StoreRefusal, jsonb_refusal, text_bytes_refusal



@dataclass(frozen=True)
class QuarantinedRecord:
    log_offset: int
    received_at_us: int
    refusal: StoreRefusal

    def as_checkpoint_entry(self) -> list[Any]:
        return [self.log_offset, self.received_at_us, self.refusal.sqlstate, self.refusal.describe()]


def record_refusal(source: WebhookSource, key: str | None, headers: str | None, body: bytes) -> StoreRefusal | None:
    """Why the store refuses one log record of `source` (its decoded fields), or None."""
    body_format = source.body_format
    if body_format in ("json", "json_array"):
        refusal = jsonb_refusal(body)
    elif body_format == "text":
        refusal = text_bytes_refusal(body)
    else:
        refusal = None
    if refusal is None and headers is not None:
        refusal = jsonb_refusal(headers.encode("utf-8", "surrogatepass"))  # a NUL in a header is \u0000 here
    if refusal is None and key is not None and "\x00" in key:
        refusal = text_bytes_refusal(b"\x00")
    return refusal


def refused_records(source: WebhookSource, table: pa.Table) -> list[QuarantinedRecord]:
    """The records of a batch (log_source.ARROW_SCHEMA) the store refuses, in log order. Vectorized prefilter: only
    rows holding a `\\u` escape or a NUL byte (or, for TEXT, any non-ASCII byte) are checked one by one."""
    if table.num_rows == 0:
        return []
    body = table["body"]
    suspect = pc.match_substring(body, "\\u") if source.body_format in ("json", "json_array") else None
    if source.body_format == "text":
        # NUL, or bytes that may be invalid UTF-8: anything outside ASCII is looked at in Python.
        suspect = pc.or_kleene(pc.match_substring(body, "\x00"),
                         pc.invert(pc.string_is_ascii(pc.cast(body, pa.string(), safe=False))))
    for column, needle in (("headers", "\\u"), ("idempotency_key", "\x00")):
        found = pc.match_substring(table[column], needle)
        suspect = found if suspect is None else pc.or_kleene(suspect, found)
    if suspect is None or not pc.any(pc.fill_null(suspect, False)).as_py():
        return []
    candidates = table.filter(pc.fill_null(suspect, False))
    refused = []
    for offset, received_at, key, headers, raw in zip(*(candidates[name].to_pylist() for name in (
            "log_offset", "received_at", "idempotency_key", "headers", "body"))):
        refusal = record_refusal(source, key, headers, raw)
        if refusal is not None:
            refused.append(QuarantinedRecord(offset, received_at, refusal))
    return refused


def without_records(table: pa.Table, refused: list[QuarantinedRecord]) -> pa.Table:
    offsets = pa.array([record.log_offset for record in refused], pa.int64())
    return table.filter(pc.invert(pc.is_in(table["log_offset"], value_set=offsets)))
