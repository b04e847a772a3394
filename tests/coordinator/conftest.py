"""A real coordinator (catalog, DuckDB serving store, source resources) without sockets or Spark:
tests drive it through the AdapterClient / SessionClient as pgwire and HTTP do."""

from __future__ import annotations

import asyncio
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
from headrace.store.serving import ServingStore
from headrace.webhook.ingest import IngestRegistry


@pytest.fixture
def adapter(tmp_path: Path) -> Iterator[AdapterClient]:
    layout = DataLayout(tmp_path)
    executor = ThreadPoolExecutor(max_workers=2)
    store = ServingStore(layout.store_file)
    catalog = Catalog(tmp_path, item_from_create_sql)
    resources = SourceResources(layout, store, IngestRegistry(), executor)
    coordinator = Coordinator(catalog, resources, executor, lambda _sources: None)
    yield AdapterClient(coordinator)
    executor.shutdown(wait=True)
    store.close()


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
