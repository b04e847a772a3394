"""A real coordinator (catalog, DuckDB serving store, source resources) without sockets or Spark:
tests drive it through the AdapterClient / SessionClient as pgwire and HTTP do."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from headrace.catalog.catalog import Catalog
from headrace.coordinator.client import AdapterClient, SessionClient
from headrace.coordinator.coordinator import Coordinator
from headrace.coordinator.responses import ExecuteResponse
from headrace.coordinator.sources import DataLayout, SourceResources
from headrace.sql.ddl import item_from_create_sql
from headrace.store.postgres_server import PostgresStore
from headrace.store.serving import ServingStore
from headrace.webhook.ingest import IngestRegistry


@contextlib.contextmanager
def in_process_adapter(data_dir: Path, postgres: PostgresStore | None = None) -> Iterator[AdapterClient]:
    """A coordinator over a fresh data dir (its own DuckDB store and executor), closed on exit. `postgres`: the
    store PostgreSQL PostgreSQL's own statements run on (coordinator/passthrough.py); None: none."""
    layout = DataLayout(data_dir)
    executor = ThreadPoolExecutor(max_workers=2)
    store = ServingStore(layout.store_file)
    catalog = Catalog(data_dir, item_from_create_sql)
    resources = SourceResources(layout, store, IngestRegistry(), executor)
    coordinator = Coordinator(catalog, resources, executor, lambda _sources: None, postgres=postgres)
    try:
        yield AdapterClient(coordinator)
    finally:
        executor.shutdown(wait=True)
        store.close()


def fill_table_in_store(adapter: AdapterClient, values_sql: str) -> None:
    """Rows for the only table, written straight into its store table as the serving driver writes a table's
    rows (there is no pipeline in process): `values_sql` is a DuckDB query giving (k, v) rows."""
    store = adapter._coordinator.resources.store  # type: ignore[attr-defined]
    with store.cursor() as cursor:
        name = cursor.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = "
                              "'headrace_internal' AND table_name LIKE 'table_%'").fetchone()[0]
        cursor.execute(f'INSERT INTO headrace_internal."{name}" (k, v, hr_version) SELECT *, 1 FROM ({values_sql})')
    store.note_committed()


@pytest.fixture
def adapter(tmp_path: Path) -> Iterator[AdapterClient]:
    with in_process_adapter(tmp_path) as client:
        yield client


async def new_client(adapter: AdapterClient, **params: str) -> SessionClient:
    return await adapter.new_session("headrace", "headrace", dict(params))


async def run(client: SessionClient, sql: str, cancel: asyncio.Event | None = None) -> ExecuteResponse:
    """One statement through the unnamed statement and portal, as the simple query protocol does."""
    await client.prepare("", sql, ())
    client.bind("", "", ())
    return await client.execute("", 0, cancel or asyncio.Event())


async def run_batch(client: SessionClient, sql: str) -> list[ExecuteResponse]:
    """A whole simple Query: every statement, then the end of the batch (Sync)."""
    try:
        results = [await run(client, statement) for statement in client.split_statements(sql)]
    except Exception:
        client.on_error()
        raise
    finally:
        client.close_statement("")
        client.on_sync()
    return results
