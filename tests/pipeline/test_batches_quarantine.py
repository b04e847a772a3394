"""SourceBatches (pipeline/batches.py) with records the store refuses in a micro-batch, through Spark and the real
serving driver: the refused records are in neither the source's table nor its view, they are listed once in the
quarantine relation with the batch's commit, and the batch after them flows. Both collection paths: one Spark job
(a count view: OneJobBatch) and persist + a job per view (array_agg)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from headrace.catalog.views import MaterializedView
from headrace.log.segments import SegmentedLog
from headrace.materialize.protocol import MaterializationSpec
from headrace.materialize.reduce import combine_lww, reducer_for_schema
from headrace.materialize.sources import source_binding
from headrace.pipeline.batches import SourceBatches
from headrace.pipeline.log_source import arrow_batches
from headrace.pipeline.view_changes import OneJobBatch, compile_source_views
from headrace.sql.ddl import item_from_create_sql
from headrace.sql.view_chain import stored_fields
from headrace.store.quarantine import quarantine_snapshot
from headrace.store.serving import ServingStore
from headrace.webhook.record import WebhookRecord, encode
from tests.materialize.conftest import DriverServer

SOURCE_SQL = "CREATE SOURCE events FROM WEBHOOK BODY FORMAT JSON"
VIEWS = {
    "one_job": "CREATE MATERIALIZED VIEW v AS SELECT body->>'g' AS g, count(*) AS n FROM events GROUP BY body->>'g'",
    "persist": "CREATE MATERIALIZED VIEW v AS SELECT body->>'g' AS g, array_agg(body->>'id') AS ids FROM events "
               "GROUP BY body->>'g'",
}
FIRST = [b'{"id": "a", "g": "x"}', rb'{"id": "bad1", "g": "x", "s": "\ud800"}', b'{"id": "b", "g": "y"}',
         rb'{"id": "bad2", "g": "y", "s": "\u0000"}']
SECOND = [b'{"id": "c", "g": "x"}']


def log_batch(log: SegmentedLog, directory: Path, bodies: list[bytes]) -> pa.Table:
    start = log.end_offset
    log.append_offsets([encode(WebhookRecord(1_700_000_000_000_000, None, None, body)) for body in bodies])
    log.sync()
    return pa.Table.from_batches(list(arrow_batches(directory, start, log.end_offset)))


def rows(store: ServingStore, sql: str) -> list[tuple[Any, ...]]:
    with store.cursor() as cursor:
        return sorted(cursor.execute(sql).fetchall())


@pytest.mark.parametrize("path", sorted(VIEWS))
def test_refused_records_are_quarantined_and_the_batches_go_on(spark: Any, tmp_path: Path, path: str) -> None:
    source = item_from_create_sql("u1", SOURCE_SQL)
    view = MaterializedView(id="u2", name="v", create_sql=VIEWS[path], input_schema="public", input_name="events")
    (views, failed) = compile_source_views(source, [view])
    assert not failed and OneJobBatch.eligible(source, views) == (path == "one_job")
    store = ServingStore(tmp_path / "store.duckdb")
    server = DriverServer(store)
    try:
        spec = MaterializationSpec(name=source.materialization, bindings=(source_binding(source), views[0].binding))
        runtime = server.runtime(spec, reducers=[combine_lww, reducer_for_schema(views[0].plan.reduce_schema)],
                                 finalizers=[None, views[0].plan.finalize])
        runtime.open()
        log_dir = tmp_path / "log"
        log = SegmentedLog(log_dir)
        batches = SourceBatches(source, runtime, "epoch", -1, views, log_dir)
        first = log_batch(log, log_dir, FIRST)
        batches(spark.createDataFrame(first), 0)
        batches(spark.createDataFrame(log_batch(log, log_dir, SECOND)), 1)
        runtime.finish_commit()
        stored = rows(store, "SELECT body->>'id' FROM headrace_internal.source_u1")
        assert stored == [("a",), ("b",), ("c",)]
        schema, table = views[0].binding.resource_path
        columns = ", ".join(f'"{field}"' for _, field, _ in stored_fields(views[0].plan))
        view_rows = rows(store, f'SELECT {columns} FROM {schema}."{table}"')
        assert view_rows == ([("x", 2), ("y", 1)] if path == "one_job" else [("x", '["a","c"]'), ("y", '["b"]')])
        with store.cursor() as cursor:
            listed = quarantine_snapshot(cursor).to_pylist()
        offsets = first["log_offset"].to_pylist()
        assert [(r["source"], r["log_offset"], r["sqlstate"]) for r in listed] == [
            ("public.events", offsets[1], "22P02"), ("public.events", offsets[3], "22P05")]
        runtime.close()
        log.close()
    finally:
        server.stop()
        store.close()
