"""BatchLoop (pipeline/batch_loop.py): every source in one loop, each committing exactly once through its own
materialization, through Spark and the real serving driver. Sources come and go without stopping the others; a
new loop (a restarted pipeline) resumes each source from the store's checkpoint; a commit the store refuses
restarts only that source, from the store's checkpoint; a backlog is one batch, read by the loop in local mode and by
Spark tasks in parallel ranges through the log read service on a cluster."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.catalog.views import MaterializedView
from headrace.log.segments import SegmentedLog
from headrace.pipeline.batch_loop import BatchLoop
from headrace.pipeline.log_source import MIN_RECORDS_PER_PARTITION
from headrace.pipeline.process import LogService
from headrace.sql.ddl import item_from_create_sql
from headrace.sql.view_chain import stored_fields
from headrace.pipeline.view_changes import compile_source_views
from headrace.store.serving import ServingStore
from headrace.webhook.record import WebhookRecord, encode
from tests.materialize.conftest import DriverServer


def source(number: int) -> Any:
    return item_from_create_sql(f"u{number}", f"CREATE SOURCE s{number} FROM WEBHOOK BODY FORMAT JSON")


def count_view(number: int, over: int) -> MaterializedView:
    return MaterializedView(id=f"v{number}", name=f"v{number}", input_schema="public", input_name=f"s{over}",
                            create_sql=f"CREATE MATERIALIZED VIEW v{number} AS SELECT body->>'g' AS g, count(*) AS n "
                                       f"FROM s{over} GROUP BY body->>'g'")


class Logs:
    """The sources' logs, written as the server writes them."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.logs: dict[str, SegmentedLog] = {}

    def append(self, item_id: str, bodies: list[dict[str, Any]]) -> None:
        log = self.logs.get(item_id)
        if log is None:
            log = self.logs[item_id] = SegmentedLog(self.data_dir / "logs" / item_id)
        log.append([encode(WebhookRecord(1_700_000_000_000_000, None, None, json.dumps(body).encode()))
                    for body in bodies])
        log.sync()

    def close(self) -> None:
        for log in self.logs.values():
            log.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ServingStore]:
    serving = ServingStore(tmp_path / "store.duckdb")
    yield serving
    serving.close()


@pytest.fixture
def driver(store: ServingStore) -> Iterator[DriverServer]:
    server = DriverServer(store)
    yield server
    server.stop()


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[Logs]:
    written = Logs(tmp_path / "data")
    yield written
    written.close()


def source_ids(store: ServingStore, number: int) -> list[int]:
    with store.cursor() as cursor:
        try:
            rows = cursor.execute(f"SELECT body->>'n' FROM headrace_internal.source_u{number}").fetchall()
        except Exception:  # noqa: BLE001 - not created yet
            return []
    return sorted(int(row[0]) for row in rows)


def view_rows(store: ServingStore, view: MaterializedView, over: Any) -> list[tuple[Any, ...]]:
    compiled, _ = compile_source_views(over, [view])
    schema, table = compiled[0].binding.resource_path
    columns = ", ".join(f'"{field}"' for _, field, _ in stored_fields(compiled[0].plan))
    with store.cursor() as cursor:
        try:
            return sorted(cursor.execute(f'SELECT {columns} FROM {schema}."{table}"').fetchall())
        except Exception:  # noqa: BLE001 - not created yet
            return []


def wait_until(predicate: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def events(first: int, count: int) -> list[dict[str, Any]]:
    return [{"n": n, "g": f"g{n % 3}"} for n in range(first, first + count)]


def test_sources_come_and_go_in_one_loop_each_exactly_once(spark: Any, tmp_path: Path, store: ServingStore,
                                                           driver: DriverServer, logs: Logs) -> None:
    sources = [source(n) for n in range(3)]
    view = count_view(10, over=0)
    for n in range(3):
        logs.append(f"u{n}", events(0, 5))
    loop = BatchLoop(spark, tmp_path / "data", (driver.host, driver.port), tick_s=0.05)
    try:
        loop.reconcile(sources, [view])
        wait_until(lambda: all(source_ids(store, n) == list(range(5)) for n in range(3)), what="the first rows")
        wait_until(lambda: view_rows(store, view, sources[0]) == [("g0", 2), ("g1", 2), ("g2", 1)], what="the view")
        # a source is dropped, another added: the others go on
        sources = [sources[0], sources[2], source(3)]
        loop.reconcile(sources, [view])
        assert set(loop.entries) == {"u0", "u2", "u3"}
        logs.append("u3", events(0, 2))
        logs.append("u0", events(5, 4))
        wait_until(lambda: source_ids(store, 3) == [0, 1] and source_ids(store, 0) == list(range(9)),
                   what="rows after the change")
        wait_until(lambda: view_rows(store, view, sources[0]) == [("g0", 3), ("g1", 3), ("g2", 3)], what="the view")
        report = {row["source"]: row["state"] for row in loop.status_report()}
        assert report == {"public.s0": "running", "public.s2": "running", "public.s3": "running"}
    finally:
        loop.stop()
    # a new loop (the pipeline restarted) resumes each source from its stored checkpoint: nothing twice
    logs.append("u0", events(9, 3))
    loop = BatchLoop(spark, tmp_path / "data", (driver.host, driver.port), tick_s=0.05)
    try:
        loop.reconcile(sources, [view])
        wait_until(lambda: source_ids(store, 0) == list(range(12)), what="rows after the restart")
        wait_until(lambda: view_rows(store, view, sources[0]) == [("g0", 4), ("g1", 4), ("g2", 4)], what="the view")
        time.sleep(0.5)
        assert source_ids(store, 0) == list(range(12)) and source_ids(store, 2) == list(range(5))
    finally:
        loop.stop()


def test_a_failed_commit_restarts_only_that_source_from_the_store(tmp_path: Path, store: ServingStore,
                                                                  driver: DriverServer, logs: Logs) -> None:
    """Sources without views need nothing of Spark (their batches commit as Arrow): no session here."""
    sources = [source(0), source(1)]
    loop = BatchLoop(None, tmp_path / "data", (driver.host, driver.port), tick_s=0.05)
    try:
        loop.reconcile(sources)
        logs.append("u0", events(0, 3))
        logs.append("u1", events(0, 3))
        wait_until(lambda: source_ids(store, 0) == [0, 1, 2] and source_ids(store, 1) == [0, 1, 2])
        # another runtime of u0 opens (a zombie's successor): the loop's runtime is fenced off
        fencing = driver.runtime(loop.entries["u0"].runtime.spec)
        fencing.open()
        fencing.close()
        logs.append("u0", events(3, 2))
        logs.append("u1", events(3, 2))
        wait_until(lambda: source_ids(store, 1) == list(range(5)), what="the other source going on")
        wait_until(lambda: loop.failures.get("u0", 0) >= 1, what="the fenced source's failure")
        # the control thread (process.main) retries failed sources every second: here the test does
        wait_until(lambda: loop.restart_failed() is None and source_ids(store, 0) == list(range(5)), timeout=60,
                   what="the restarted source")
        assert [row["state"] for row in loop.status_report()] == ["running", "running"]
        assert loop.failures.get("u1", 0) == 0
    finally:
        loop.stop()


@pytest.fixture
def log_service(tmp_path: Path) -> Iterator[LogService]:
    """The server's log read service over the test's logs, on a loopback port (log/read_service.py)."""
    from headrace.log.read_service import LogReadService, start_log_read_service

    token = "t" * 43
    loop = asyncio.new_event_loop()
    started: dict[str, Any] = {}
    ready = threading.Event()

    async def main() -> None:
        server = await start_log_read_service(LogReadService(tmp_path / "data" / "logs", token), "127.0.0.1", 0)
        started.update(server=server, url=f"http://{server.address[0]}:{server.address[1]}")
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(main()), loop.run_forever()), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield LogService(started["url"], token)
    asyncio.run_coroutine_threadsafe(started["server"].close(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.mark.parametrize("through_service", [False, True], ids=["local: read by the loop", "cluster: Spark tasks"])
def test_a_backlog_is_read_whole(spark: Any, tmp_path: Path, store: ServingStore, driver: DriverServer, logs: Logs,
                                 through_service: bool, request: pytest.FixtureRequest) -> None:
    """A batch of several ranges: in local mode the loop reads it itself; on a cluster Spark's tasks read the ranges
    in parallel through the log read service."""
    from headrace.pipeline.log_source import HeadraceLogSource

    spark.dataSource.register(HeadraceLogSource)  # as process.build_spark does
    total = 2 * MIN_RECORDS_PER_PARTITION + 1_000
    logs.append("u0", events(0, total))
    view = count_view(10, over=0)
    service = request.getfixturevalue("log_service") if through_service else None
    loop = BatchLoop(spark, tmp_path / "data", (driver.host, driver.port), service, tick_s=0.05)
    try:
        loop.reconcile([source(0)], [view])
        wait_until(lambda: len(source_ids(store, 0)) == total, timeout=120, what="the backlog")
        assert source_ids(store, 0) == list(range(total))
        per_group = [(f"g{g}", len(range(g, total, 3))) for g in range(3)]
        wait_until(lambda: view_rows(store, view, source(0)) == per_group, what="the view over the backlog")
        assert loop.entries["u0"].next_batch_id == 1  # one batch of several ranges, not one per range
    finally:
        loop.stop()


def test_records_the_store_refuses_are_quarantined_without_spark(tmp_path: Path, store: ServingStore,
                                                                 driver: DriverServer, logs: Logs) -> None:
    from headrace.store.quarantine import quarantine_snapshot

    loop = BatchLoop(None, tmp_path / "data", (driver.host, driver.port), tick_s=0.05)
    try:
        loop.reconcile([source(0)])
        log = logs.logs.get("u0") or SegmentedLog(tmp_path / "data" / "logs" / "u0")
        logs.logs["u0"] = log
        bodies = [b'{"n": 0}', rb'{"n": 1, "s": "\u0000"}', b'{"n": 2}']
        offsets = log.append_offsets([encode(WebhookRecord(1_700_000_000_000_000, None, None, body))
                                      for body in bodies])
        log.sync()
        wait_until(lambda: source_ids(store, 0) == [0, 2], what="the accepted rows")
        logs.append("u0", events(3, 1))
        wait_until(lambda: source_ids(store, 0) == [0, 2, 3], what="the batch after them")
        with store.cursor() as cursor:
            listed = quarantine_snapshot(cursor).to_pylist()
        assert [(r["source"], r["log_offset"], r["sqlstate"]) for r in listed] == [("public.s0", offsets[1], "22P05")]
    finally:
        loop.stop()


def test_a_row_a_view_cannot_evaluate_leaves_the_loop_batch_and_its_other_rows(spark: Any, tmp_path: Path,
                                                                                 store: ServingStore,
                                                                                 driver: DriverServer,
                                                                                 logs: Logs) -> None:
    """The view's one-job projection (OneJobBatch.project) fails on a bad cast: the batch takes the general path,
    which leaves that row out of the view only (pipeline/view_errors.py); the source keeps every row."""
    view = MaterializedView(id="v10", name="v10", input_schema="public", input_name="s0",
                            create_sql="CREATE MATERIALIZED VIEW v10 AS SELECT body->>'g' AS g, "
                                       "sum((body->>'v')::int) AS total FROM s0 GROUP BY body->>'g'")
    logs.append("u0", [{"n": 0, "g": "a", "v": "1"}, {"n": 1, "g": "a", "v": "x"}, {"n": 2, "g": "b", "v": "5"}])
    loop = BatchLoop(spark, tmp_path / "data", (driver.host, driver.port), tick_s=0.05)
    try:
        loop.reconcile([source(0)], [view])
        wait_until(lambda: source_ids(store, 0) == [0, 1, 2], what="every row of the source")
        wait_until(lambda: view_rows(store, view, source(0)) == [("a", 1), ("b", 5)], what="the view without the row")
        logs.append("u0", [{"n": 3, "g": "b", "v": "2"}])
        wait_until(lambda: view_rows(store, view, source(0)) == [("a", 1), ("b", 7)], what="the next batch")
        assert loop.failures == {}
    finally:
        loop.stop()
