"""Units of issue 18's observability (no server): statement kinds and redaction, session states, histograms, the
pipeline's backoff as the relation computes it, materialization states from a real catalog, ledger and DuckDB
store, the catalog objects' dependencies, and /health/ready's verdicts."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from headrace.catalog.catalog import Catalog
from headrace.catalog.indexes import IndexCatalog
from headrace.catalog.items import Secret
from headrace.catalog.system.objects import CatalogObjects
from headrace.catalog.views import MaterializedView
from headrace.http.health import Health
from headrace.http.webhook_endpoint import ServerState
from headrace.metrics.histogram import Histogram
from headrace.metrics.materialization_status import MaterializationStatus
from headrace.metrics.materializations import STALL_AFTER_S, MaterializationLedger
from headrace.metrics.sessions import SessionActivity, redacted, statement_kind
from headrace.pipeline.status import PipelineCollector, PipelineStatus, batch_stats, retry_delay_s, status_row
from headrace.sql.ddl import item_from_create_sql
from headrace.store.serving import ServingStore


def test_statement_kinds() -> None:
    assert statement_kind("  select 1") == "select"
    assert statement_kind("/* hi */ -- x\n(SELECT 1)") == "select"
    assert statement_kind("WITH a AS (SELECT 1) SELECT * FROM a") == "select"
    assert statement_kind("insert into t values (1)") == "insert"
    assert statement_kind("CREATE SOURCE s FROM WEBHOOK BODY FORMAT TEXT") == "ddl"
    assert statement_kind("SUBSCRIBE t") == "subscribe"
    assert statement_kind("COMMIT") == "transaction"
    assert statement_kind("vacuum") == "other"
    assert statement_kind("") == "other"


def test_credentials_are_cut_from_statements() -> None:
    assert redacted("CREATE SECRET s AS 'x'") == "CREATE SECRET <redacted>"
    assert redacted("alter role r password 'pw'") == "alter role r password <redacted>"
    assert redacted("SELECT secretary FROM t") == "SELECT secretary FROM t"  # a word, not the keyword
    assert len(redacted("SELECT " + "1," * 2000 + "1")) == 1024


def test_session_states_follow_transactions() -> None:
    activity = SessionActivity()
    assert activity.state == "idle" and activity.query is None
    activity.begin("BEGIN")
    assert activity.state == "active" and activity.kind == "transaction"
    activity.end("T")
    assert activity.state == "idle in transaction" and activity.xact_start == activity.query_start
    activity.begin("SELECT 1/0")
    activity.end("E")
    assert activity.state == "idle in transaction (aborted)" and activity.xact_start is not None
    activity.begin("ROLLBACK")
    activity.end("I")
    assert activity.state == "idle" and activity.xact_start is None


def test_histogram_buckets_and_round_trip() -> None:
    histogram = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(value)
    assert histogram.buckets() == [("0.1", 2.0), ("1.0", 3.0), ("+Inf", 4.0)]
    copy = Histogram.from_json(histogram.to_json())
    assert copy.buckets() == histogram.buckets() and copy.total == pytest.approx(3.65) and copy.count == 4


def test_batch_figures_in_the_report() -> None:
    stats = batch_stats("source_test_figures")
    assert batch_stats("source_test_figures") is stats  # one per materialization, across query restarts
    stats.observe(7, {"read": 0.5, "source_rows": 0.1, "views": 0.2, "transaction": 0.2})
    status = PipelineStatus()
    status.update([status_row("public.f", "source_test_figures", 0, None, None, 1.0, True)])
    assert status.rows()[0][8:] == (1, 7, 7, pytest.approx(1.0), 0.5, 0.1, 0.2, 0.2)
    families = {family.name: family for family in PipelineCollector(status).collect()}
    assert families["headrace_pipeline_batch_rows"].samples[0].value == 7
    assert [s.value for s in families["headrace_pipeline_batch_phase_seconds"].samples] == [0.5, 0.1, 0.2, 0.2]


def test_retry_delay_is_the_pipelines_backoff() -> None:
    from headrace.pipeline.batch_loop import _backoff

    assert [retry_delay_s(n) for n in range(9)] == [_backoff(n) for n in range(9)]
    assert status_row("public.s", "source_u1", 3, "boom", 100.0, None, True)["next_retry_at"] == 104.0
    assert status_row("public.s", "source_u1", 3, "boom", 100.0, 101.0, True)["next_retry_at"] is None


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    catalog = Catalog(tmp_path, item_from_create_sql)
    source = item_from_create_sql(catalog.allocate_id(), "CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON")
    catalog.add(source)
    view_id = catalog.allocate_id()
    catalog.add_view(MaterializedView(view_id, "v", "CREATE MATERIALIZED VIEW v AS SELECT body FROM s",
                                      "public", "s"))
    over_id = catalog.allocate_id()
    catalog.add_view(MaterializedView(over_id, "w", "CREATE MATERIALIZED VIEW w AS SELECT body FROM v",
                                      "public", "v"))
    return catalog


def test_materialization_states(catalog: Catalog, tmp_path: Path) -> None:
    store = ServingStore(tmp_path / "store.duckdb")
    pipeline = PipelineStatus()
    ledger = MaterializationLedger()
    log_ends = {"u1": 100}
    status = MaterializationStatus(catalog, store, pipeline, lambda _kind, item_id: log_ends.get(item_id),
                                   lambda _sink: None, ledger)

    def states() -> dict[str, tuple[object, ...]]:
        status._checkpoints = (0.0, {})  # read the store again, not its cached second
        return {row["name"]: (row["state"], row["transaction_of"], row["lag_bytes"], row["attempts"])
                for row in status.rows()}

    assert states() == {"s": ("starting", "source_u1", 100, 0), "v": ("starting", "source_u1", 100, 0),
                        "w": ("starting", "source_u1", 100, 0)}  # not reported by the pipeline yet
    pipeline.update([status_row("public.s", "source_u1", 0, None, None, None, True)])
    ledger.committed("source_u1", 0.01, {"log_end": 100})
    assert states()["w"] == ("running", "source_u1", 0, 0)
    ledger.failed("source_u1", "DriverError: no")
    ledger.failed("source_u1", "DriverError: again")
    row = next(row for row in status.rows() if row["name"] == "s")
    assert (row["state"], row["attempts"], row["failures"], row["last_error"]) == \
        ("failed", 2, 2, "DriverError: again")
    ledger.committed("source_u1", 0.01, {"log_end": 100})
    log_ends["u1"] = 150  # work pending, and the last commit long ago: stalled
    record = ledger._records["source_u1"]
    record.last_commit_at = time.time() - STALL_AFTER_S - 5
    assert states()["s"] == ("stalled", "source_u1", 50, 0)
    rows = status.relation_rows()
    assert [row[3] for row in rows] == ["s", "v", "w"] and isinstance(rows[0][15], int)  # last_commit_at in us
    store.close()


def test_objects_and_dependencies(catalog: Catalog, tmp_path: Path) -> None:
    catalog.add_secret(Secret(catalog.allocate_id(), "tok"), b"value")
    indexes = IndexCatalog(tmp_path)
    objects = CatalogObjects(catalog, indexes.all)
    assert [(row[2], row[3], row[6] is None) for row in objects.object_rows()] == [
        ("s", "source", False), ("tok", "secret", True), ("v", "materialized view", False),
        ("w", "materialized view", False)]
    assert [(row[2], row[6], row[7]) for row in objects.dependency_rows()] == [
        ("v", "s", "source"), ("w", "v", "materialized view")]


def test_health_names_what_is_not_ready() -> None:
    state = ServerState()
    health = Health(state)
    ok, body = asyncio.run(health.ready())
    assert not ok and [part["part"] for part in body["not_ready"]] == ["server", "pipeline", "store"]
    state.ready = True
    pipeline = PipelineStatus()
    health.pipeline = pipeline.pipeline
    health.store_ping = lambda: None
    health.materializations = lambda: [{"schema": "public", "name": "s", "kind": "source", "materialization":
                                        "source_u1", "state": "failed", "last_error": "DriverError: no",
                                        "last_error_at": 0.0, "attempts": 3, "next_retry_at": 4.0,
                                        "lag_seconds": 0.0, "last_commit_at": None}]
    ok, body = asyncio.run(health.ready())
    assert not ok and body["not_ready"][0] == {"part": "pipeline", "state": "starting",
                                               "reason": "the pipeline process is starting"}
    assert body["not_ready"][1]["name"] == "public.s" and body["not_ready"][1]["reason"] == "DriverError: no"
    assert body["not_ready"][1]["since"] == "1970-01-01T00:00:00Z"
    pipeline.pipeline_ready()

    def refuse() -> None:
        raise OSError("connection refused\nmore")

    health.store_ping = refuse
    ok, body = asyncio.run(health.ready())
    assert not ok and body["not_ready"] == [{"part": "store", "reason": "connection refused",
                                             "waited_s": body["not_ready"][0]["waited_s"]}]
    health.store_ping = lambda: None
    health.materializations = lambda: []
    assert asyncio.run(health.ready()) == (True, {"status": "ready", "not_ready": [], "parts": {
        "server": "ready", "pipeline": "running", "store": "ready", "materializations": 0}})


def test_a_restricted_column_is_hidden_from_snapshots_that_do_not_know_the_reader() -> None:
    from headrace.store.system_tables import INSUFFICIENT_PRIVILEGE, SystemRelation

    relation = SystemRelation((("usename", "VARCHAR"), ("query", "VARCHAR"), ("pid", "INTEGER")),
                              lambda: [("alice", "SELECT 1", 7)], restricted=("query", "usename"))
    assert relation.snapshot().to_pylist() == [{"usename": "alice", "query": INSUFFICIENT_PRIVILEGE, "pid": 7}]
