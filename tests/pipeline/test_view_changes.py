"""pipeline/view_changes.py on a real log (the real writer and record encoding) and a real SparkSession:
per-batch changes with replaced rows read back from the log, and the backfill over the log's live rows,
both reduced and finalized as the runtime does, equal a from-scratch recomputation of the view."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from headrace.catalog.views import MaterializedView
from headrace.log.segments import SegmentedLog
from headrace.pipeline.view_changes import (
    backfill_documents,
    changes_frame,
    compile_source_views,
    read_replaced,
    view_documents_of,
)
from headrace.sql.ddl import item_from_create_sql
from headrace.webhook.record import WebhookRecord, encode
from tests.sql.view_model import AGGREGATES_SQL, Event, RuntimeModel, assert_same, body_of, expected_groups

SOURCE_SQL = "CREATE SOURCE events FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id')"


class LoggedSource:
    """Writes requests to a real log as the ingest does: a repeat of a key names its previous row's offset."""

    def __init__(self, directory: Path) -> None:
        self.log = SegmentedLog(directory)
        self.directory = directory
        self.latest: dict[str, int] = {}
        self.live: dict[str, tuple[int, Event]] = {}

    def write(self, events: list[Event]) -> pa.Table:
        """Append one batch; returns it as the log source's Spark rows (Arrow)."""
        rows: dict[str, list[Any]] = {c: [] for c in ("log_offset", "prev_offset", "received_at", "idempotency_key",
                                                       "headers", "body")}
        for event in events:
            body = json.dumps({**body_of(event), "id": event.key}).encode()
            prev = self.latest.get(event.key)
            offset = self.log.append_offsets([encode(WebhookRecord(1_700_000_000_000_000, event.key, None, body,
                                                                   prev))])[0]
            self.latest[event.key] = offset
            self.live[event.key] = (offset, event)
            for name, value in zip(rows, (offset, prev, 1_700_000_000_000_000, event.key, None, body)):
                rows[name].append(value)
        self.log.sync()
        return pa.table(rows, schema=pa.schema([("log_offset", pa.int64()), ("prev_offset", pa.int64()),
                                                 ("received_at", pa.int64()), ("idempotency_key", pa.string()),
                                                 ("headers", pa.string()), ("body", pa.binary())]))

    def live_rows(self) -> list[tuple[int, Event]]:
        return sorted(self.live.values(), key=lambda entry: entry[0])


def contents(model: RuntimeModel) -> dict[Any, dict[str, Any]]:
    result = {}
    for doc in model.store.values():
        row = {o.name: doc[o.expression.name] for o in model.plan.outputs}
        result[row.pop("customer")] = row
    return result


BATCHES = [
    [Event("e1", "c1", 5, True, "a"), Event("e2", "c2", 7, None, "b"), Event("e3", "c1", 40, False, None)],
    [Event("e2", "c1", 9, False, "c"), Event("e1", "c1", 5, True, "a"), Event("e4", None, None, True, "a")],
    [Event("e3", "c2", -4, True, "b"), Event("e5", "c2", 11, None, "c"), Event("e5", "c3", 12, True, "a")],
]


def test_batches_with_replacements_then_a_backfill_agree_with_recomputation(spark: Any, tmp_path: Path) -> None:
    source = item_from_create_sql("u1", SOURCE_SQL)
    view = MaterializedView(id="u2", name="totals", create_sql=AGGREGATES_SQL.format(source="events"),
                            input_schema="public", input_name="events")
    (views, failed) = compile_source_views(source, [view])
    assert not failed and views[0].index == 1
    logged = LoggedSource(tmp_path / "log")
    model = RuntimeModel(views[0].plan)
    for events in BATCHES:
        batch = logged.write(events)
        replacing = [(p, o) for p, o in zip(batch["prev_offset"].to_pylist(), batch["log_offset"].to_pylist())
                     if p is not None]
        replaced = read_replaced(logged.directory, [p for p, _ in replacing], [o for _, o in replacing]) \
            if replacing else None
        documents = list(view_documents_of(views, changes_frame(spark, source, batch, replaced)))
        assert {binding for binding, _, _ in documents} == {1}
        model.transact((key, doc) for _, key, doc in documents)
        assert_same(contents(model), expected_groups(logged.live_rows()))

    # A view created now starts from the log's live rows: same contents, from one backfill.
    fresh = RuntimeModel(views[0].plan)
    end = logged.log.end_offset
    fresh.transact((key, doc) for _, key, doc in backfill_documents(spark, source, logged.directory, end, views))
    assert_same(contents(fresh), expected_groups(logged.live_rows()))
    logged.log.close()


def test_a_view_that_does_not_compile_is_reported_not_raised() -> None:
    source = item_from_create_sql("u1", SOURCE_SQL)
    broken = MaterializedView(id="u3", name="bad", create_sql="CREATE MATERIALIZED VIEW bad AS SELECT nope FROM events",
                              input_schema="public", input_name="events")
    good = MaterializedView(id="u4", name="n", create_sql="CREATE MATERIALIZED VIEW n AS SELECT count(*) AS n FROM events",
                            input_schema="public", input_name="events")
    views, failed = compile_source_views(source, [broken, good])
    assert [v.view.id for v in views] == ["u4"] and views[0].index == 1
    assert [view.id for view, _ in failed] == ["u3"]


ONE_JOB_VIEWS = [
    "CREATE MATERIALIZED VIEW flags AS SELECT body->>'customer' AS customer, count(*) AS n, count(body->>'tag') AS "
    "n_tag, bool_or((body->>'flag')::bool) AS any_flag, bool_and((body->>'flag')::bool) AS all_flag "
    "FROM events GROUP BY body->>'customer'",
    # The WHERE excludes rows whose amount is not an integer: the projection must not evaluate their cast.
    "CREATE MATERIALIZED VIEW tagged AS SELECT body->>'tag' AS tag, count(*) AS n, "
    "sum((body->>'amount')::int) AS total FROM events WHERE body->>'tag' <> 'b' GROUP BY body->>'tag'",
]


def test_one_job_batches_equal_spark_groupby_with_replacements(spark: Any, tmp_path: Path) -> None:
    """OneJobBatch (log rows and every view's projection from one Spark job, retractions by a second small one)
    gives the same partial documents as Spark's filter + groupBy over the change stream."""
    from headrace.pipeline.view_changes import OneJobBatch
    from headrace.pipeline.views import SparkExpressions, _aggregate_documents, prepare_changes

    source = item_from_create_sql("u1", SOURCE_SQL)
    items = [MaterializedView(id=f"u{2 + i}", name=sql.split()[3], create_sql=sql, input_schema="public",
                              input_name="events") for i, sql in enumerate(ONE_JOB_VIEWS)]
    (views, failed) = compile_source_views(source, items)
    assert not failed and OneJobBatch.eligible(source, views)
    one_job = OneJobBatch(source, views, columnar=False)
    logged = LoggedSource(tmp_path / "log")
    batches = [*BATCHES, [Event("e6", "c4", None, True, "b")]]
    for events in batches:
        batch = logged.write(events)
        rows = batch.to_pylist()
        for row in rows:  # a row the WHERE drops carries an amount that does not cast to int
            if json.loads(row["body"])["tag"] == "b":
                row["body"] = json.dumps({**json.loads(row["body"]), "amount": "not a number"}).encode()
        batch = pa.Table.from_pylist(rows, schema=batch.schema)
        table, projected = one_job.collect(spark.createDataFrame(batch))
        assert table.equals(batch)
        documents, columnar = one_job.documents(spark, table, projected, logged.directory)
        assert columnar == []
        replacing = [(p, o) for p, o in zip(batch["prev_offset"].to_pylist(), batch["log_offset"].to_pylist())
                     if p is not None]
        replaced = read_replaced(logged.directory, [p for p, _ in replacing], [o for _, o in replacing]) \
            if replacing else None
        changes = changes_frame(spark, source, batch, replaced)
        expected = []
        for view in views:
            frame = prepare_changes(view.plan, changes)
            translate = SparkExpressions(view.plan.input.columns)
            if view.plan.filter is not None:
                frame = frame.where(translate(view.plan.filter))
            expected += [(view.index, key, doc) for key, doc in _aggregate_documents(view.plan, frame, translate)]
        canonical = sorted(json.dumps(entry, sort_keys=True) for entry in documents)
        assert canonical == sorted(json.dumps(entry, sort_keys=True) for entry in expected)
    logged.log.close()
