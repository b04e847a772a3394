"""Materialized views over a table, maintained in the table's own transactions (as views over a source are:
pipeline/view_changes.py, whose SourceView and view_documents_of this module reuses).

A micro-batch's change records become the change-stream contract of pipeline/views.py, in record order:
an insert is +1 new row, a delete -1 old row, an update -1 old row then +1 new row sharing one hr_seq (the
-1 sorts first). hr_row is the canonical JSON of the row's key (primary key or hidden row id), hr_at the
row version (`hr_version`, given at write time and carried by the old row a change retracts). Columns are
in the contract's form: jsonb as JSON text, timestamptz as integer microseconds, bytea as bytes.

Backfill: a view created over a table that already holds rows starts, in one transaction, from the table's
live rows in the log up to the stored checkpoint's `log_end` (as +1 changes, `backfill_documents`), committed
by Pipeline._backfill with the checkpoint now listing the view; the stream goes on from `log_end`."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from headrace.catalog.tables import HIDDEN_VERSION, Table
from headrace.catalog.views import MaterializedView
from headrace.log.reader import read_records
from headrace.pipeline.view_changes import SourceView, documents_isolating_changes, view_documents_of
from headrace.pipeline.view_errors import DocumentsWithErrors, ErrorEntry, is_data_error
from headrace.sql.parser import parse_statement
from headrace.sql.views import InputRelation, compile_view
from headrace.store.table_types import numeric_shape
from headrace.store.table_log import DELETE, Document, RowChange, decode_changes

BACKFILL_CHUNK_ROWS = 200_000
_VIEW_TYPES = {"json": "jsonb", "bpchar": "text"}  # as the view compiler knows them
_ARROW = {"int2": pa.int32(), "int4": pa.int32(), "int8": pa.int64(), "float4": pa.float64(), "float8": pa.float64(),
          "text": pa.string(), "varchar": pa.string(), "bool": pa.bool_(), "timestamptz": pa.int64(),
          "jsonb": pa.string(), "bytea": pa.binary(), "numeric": pa.float64(),
          # date, timestamp, interval and uuid travel in their document form: days, microseconds, text
          "date": pa.int64(), "timestamp": pa.int64(), "interval": pa.int64(), "uuid": pa.string()}


def table_relation(table: Table) -> InputRelation:
    """The table as a view's input: its declared columns, keyed by its key, not append-only."""
    columns = {c.name: _VIEW_TYPES.get(c.pg_type, c.pg_type) for c in table.columns}
    # A numeric column's display scale is the one the table holds: numeric(p,s) s, numeric(p) 0, and an
    # unconstrained numeric 10 (held as numeric(38,10), docs/tables.md), as the table's own SELECT shows it.
    scales = {c.name: numeric_shape(c.precision, c.scale)[1] for c in table.columns if c.pg_type == "numeric"}
    return InputRelation(kind="table", item_id=table.id, name=table.name, columns=columns, key=table.store_key,
                         append_only=False, scales=scales)


def compile_table_views(table: Table, views: Sequence[MaterializedView],
                        first_index: int = 1) -> tuple[list[SourceView], list[tuple[MaterializedView, Exception]]]:
    relation = table_relation(table)

    def lookup(schema: str, name: str) -> InputRelation | None:
        return relation if (schema, name) == (table.schema, table.name) else None

    compiled: list[SourceView] = []
    failed: list[tuple[MaterializedView, Exception]] = []
    for view in views:
        try:
            plan = compile_view(parse_statement(view.create_sql), lookup)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - one broken view must not stop its table
            failed.append((view, exc))
            continue
        compiled.append(SourceView(view, plan, first_index + len(compiled)))
    return compiled, failed


def change_rows(table: Table, records: Sequence[list[RowChange]], first_seq: int = 0) -> pa.Table:
    """Change records -> the change-stream contract as Arrow (see the module docstring)."""
    columns: dict[str, list[Any]] = {c.name: [] for c in table.columns}
    meta: dict[str, list[Any]] = {"hr_diff": [], "hr_seq": [], "hr_row": [], "hr_at": []}
    seq = first_seq
    for changes in records:
        for change in changes:
            seq += 1
            hr_row = json.dumps(list(change.key), separators=(",", ":"), sort_keys=True)
            versions = ((-1, change.old), (1, None if change.op == DELETE else change.new))
            for diff, row in versions:
                if row is None:
                    continue
                for column in table.columns:
                    columns[column.name].append(_contract_value(column.pg_type, row.get(column.name)))
                meta["hr_diff"].append(diff)
                meta["hr_seq"].append(seq)
                meta["hr_row"].append(hr_row)
                meta["hr_at"].append(int(row.get(HIDDEN_VERSION) or seq))
    arrays = {c.name: pa.array(columns[c.name], _ARROW[_VIEW_TYPES.get(c.pg_type, c.pg_type)]) for c in table.columns}
    arrays.update({"hr_diff": pa.array(meta["hr_diff"], pa.int32()), "hr_seq": pa.array(meta["hr_seq"], pa.int64()),
                   "hr_row": pa.array(meta["hr_row"], pa.string()), "hr_at": pa.array(meta["hr_at"], pa.int64())})
    return pa.table(arrays)


def _contract_value(pg_type: str, value: Any) -> Any:
    if value is None:
        return None
    if pg_type in ("json", "jsonb"):
        return json.dumps(value, separators=(",", ":"))
    if pg_type == "bytea":
        return base64.b64decode(value)
    if pg_type == "numeric":  # the view contract carries numeric as double (pipeline/views.py doc_value)
        return float(value)
    return value


def view_documents_and_errors(spark: Any, table: Table, views: Sequence[SourceView], records: Sequence[list[RowChange]],
                              ) -> tuple[list[tuple[int, list[Any], Document]], list[ErrorEntry]]:
    """Every view's documents for the records' changes, and the error entries of changes a view cannot evaluate (left
    out of it: pipeline/view_errors.py)."""
    rows = change_rows(table, records)
    if rows.num_rows == 0:
        return [], []
    try:
        return list(view_documents_of(views, spark.createDataFrame(rows))), []
    except Exception as exc:  # noqa: BLE001 - data errors only, the rest re-raised
        if not is_data_error(exc):
            raise
    return documents_isolating_changes(views, spark, rows)


def backfill_documents(spark: Any, table: Table, log_dir: Path, end: int,
                       views: Sequence[SourceView]) -> DocumentsWithErrors:
    """Documents of `views` over the table's live rows in the log before `end` (as +1 changes), for
    Pipeline._backfill (pipeline/process.py), which commits them with the checkpoint listing the views (and the
    errors of rows a view cannot evaluate: DocumentsWithErrors)."""
    live: dict[tuple[Any, ...], Document] = {}
    for _, payload in read_records(log_dir, 0, end) if end > 0 else ():
        for change in decode_changes(payload):
            if change.op == DELETE:
                live.pop(change.key, None)
            else:
                assert change.new is not None
                live[change.key] = change.new
    documents: list[tuple[int, list[Any], Document]] = []
    errors: list[ErrorEntry] = []
    items = list(live.items())
    for start in range(0, len(items), BACKFILL_CHUNK_ROWS):
        chunk = [[RowChange("i", key, row, None)] for key, row in items[start:start + BACKFILL_CHUNK_ROWS]]
        found, found_errors = view_documents_and_errors(spark, table, views, chunk)
        documents.extend(found)
        errors.extend(found_errors)
    return DocumentsWithErrors(documents, errors)
