"""SUBSCRIBE and savepoints through a real coordinator and DuckDB serving store (no Spark): commits are
written into the store as the serving driver writes them (table, changelog, checkpoint's committed_at)."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal

import pytest

from headrace.coordinator.client import AdapterClient, SessionClient
from headrace.coordinator.responses import CommandComplete, CopyTo, SendingRows
from headrace.errors import HeadraceError
from headrace.store.serving import changelog_table, qualified_name
from tests.coordinator.conftest import new_client, run, run_batch

PATH: tuple[str, ...] = ()


def commit(client: SessionClient, source: str, inserts: list[tuple[int, dict]], deletes: list[int] = ()) -> int:
    coordinator = client._coordinator  # type: ignore[attr-defined]
    item = coordinator.catalog.find("public", source)
    path = ("headrace_internal", item.materialization)
    store = coordinator.resources.store
    timestamp = store.next_commit_timestamp()
    with store.cursor() as cursor:
        cursor.begin()
        for offset in deletes:
            cursor.execute(f"INSERT INTO {changelog_table(path)} (hr_timestamp, hr_diff, log_offset, body) "
                           f"SELECT ?, -1, log_offset, body FROM {qualified_name(path)} WHERE log_offset = ?",
                           [timestamp, offset])
            cursor.execute(f"DELETE FROM {qualified_name(path)} WHERE log_offset = ?", [offset])
        for offset, body in inserts:
            cursor.execute(f"INSERT INTO {qualified_name(path)} (log_offset, body) VALUES (?, ?)", [offset, json.dumps(body)])
            cursor.execute(f"INSERT INTO {changelog_table(path)} (hr_timestamp, hr_diff, log_offset, body) "
                           "VALUES (?, 1, ?, ?)", [timestamp, offset, json.dumps(body)])
        cursor.execute("INSERT OR REPLACE INTO headrace_internal.checkpoints VALUES (?, 0, 1, 1, '{}', ?)",
                       [item.materialization, timestamp])
        cursor.commit()
    return timestamp


async def source_client(adapter: AdapterClient) -> SessionClient:
    client = await new_client(adapter)
    await run(client, "CREATE SOURCE events FROM WEBHOOK BODY FORMAT JSON")
    return client


async def fetch(client: SessionClient, sql: str) -> list[tuple]:
    result = await run(client, sql)
    assert isinstance(result, SendingRows)
    return list(result.rows)


def test_declare_fetch_sees_snapshot_then_changes_in_order(adapter: AdapterClient) -> None:
    async def scenario() -> None:
        client = await source_client(adapter)
        first = commit(client, "events", [(1, {"a": 1})])
        await run_batch(client, "BEGIN; DECLARE c CURSOR FOR SUBSCRIBE events")
        rows = await fetch(client, "FETCH ALL c")
        assert [row[:3] for row in rows] == [(Decimal(first), 1, '{"a": 1}')]
        assert await fetch(client, "FETCH ALL c WITH (timeout = '300ms')") == []
        second = commit(client, "events", [(2, {"a": 2})], deletes=[1])
        rows = await fetch(client, "FETCH ALL c WITH (timeout = '2s')")
        assert [row[:3] for row in rows] == [(Decimal(second), -1, '{"a": 1}'), (Decimal(second), 1, '{"a": 2}')]
        await run(client, "COMMIT")

    asyncio.run(scenario())


def test_as_of_up_to_progress_and_select(adapter: AdapterClient) -> None:
    async def scenario() -> None:
        client = await source_client(adapter)
        first = commit(client, "events", [(1, {"a": 1}), (2, {"a": 5})])
        second = commit(client, "events", [(3, {"a": 7})], deletes=[2])
        third = commit(client, "events", [(4, {"a": 9})])
        await run(client, "BEGIN")
        await run(client, f"DECLARE c CURSOR FOR SUBSCRIBE events WITH (PROGRESS) AS OF {first} UP TO {third}")
        rows = []
        while batch := await fetch(client, "FETCH ALL c WITH (timeout = '2s')"):  # [] once UP TO ended it
            rows += batch
        assert sorted((r[0], r[1], r[2], r[3]) for r in rows[:2]) == [
            (Decimal(first), False, 1, '{"a": 1}'), (Decimal(first), False, 1, '{"a": 5}')]
        assert [(r[0], r[2], r[3]) for r in rows[2:]] == [(Decimal(second), -1, '{"a": 5}'), (Decimal(second), 1, '{"a": 7}')]
        await run(client, "DECLARE s CURSOR FOR SUBSCRIBE (SELECT body->>'a' AS a FROM events WHERE (body->>'a')::int > 2) "
                           "WITH (SNAPSHOT = false)")
        assert await fetch(client, "FETCH ALL s WITH (timeout = '300ms')") == []  # the stream starts at its first FETCH
        commit(client, "events", [(5, {"a": 3}), (1_000, {"a": 0})], deletes=[3])
        rows = await fetch(client, "FETCH ALL s WITH (timeout = '2s')")
        assert [row[1:] for row in rows] == [(-1, "7"), (1, "3")]
        await run(client, "ROLLBACK")

    asyncio.run(scenario())


def test_copy_subscribe_up_to_ends(adapter: AdapterClient) -> None:
    async def scenario() -> None:
        client = await source_client(adapter)
        first = commit(client, "events", [(1, {"a": 1})])
        result = await run(client, f"COPY (SUBSCRIBE events UP TO {first + 1}) TO STDOUT")
        assert isinstance(result, CopyTo)
        payloads = [payload async for batch in result.data for payload in batch]
        assert [p.split(b"\t")[:3] for p in payloads] == [[str(first).encode(), b"1", b'{"a": 1}']]

    asyncio.run(scenario())


def test_refusals(adapter: AdapterClient) -> None:
    async def scenario() -> None:
        client = await source_client(adapter)
        commit(client, "events", [(1, {"a": 1})])
        for sql, sqlstate in [("SUBSCRIBE nothing", "42P01"),
                              ("SUBSCRIBE (SELECT count(*) FROM events)", "0A000")]:
            with pytest.raises(HeadraceError) as caught:
                await run(client, sql)
            assert caught.value.sqlstate == sqlstate, sql
        client._coordinator.resources.store.compact_changelogs(retention_ms=0)  # type: ignore[attr-defined]
        await run_batch(client, "BEGIN; DECLARE c CURSOR FOR SUBSCRIBE events AS OF 5")
        with pytest.raises(HeadraceError) as caught:
            await run(client, "FETCH ALL c WITH (timeout = '2s')")
        assert caught.value.sqlstate == "55000"

    asyncio.run(scenario())


def test_savepoints(adapter: AdapterClient) -> None:
    async def scenario() -> None:
        client = await new_client(adapter)
        with pytest.raises(HeadraceError) as caught:
            await run(client, "SAVEPOINT a")
        assert caught.value.sqlstate == "25P01"
        await run_batch(client, "BEGIN; SET application_name = 'one'; SAVEPOINT a; SET application_name = 'two'")
        with pytest.raises(HeadraceError):
            await run_batch(client, "SELECT * FROM missing")
        with pytest.raises(HeadraceError) as caught:
            await run_batch(client, "SELECT 1")
        assert caught.value.sqlstate == "25P02"
        result = await run(client, "ROLLBACK TO SAVEPOINT a")
        assert isinstance(result, CommandComplete) and result.tag == "ROLLBACK"
        assert await fetch(client, "SHOW application_name") == [("one",)]
        assert (await run(client, "RELEASE SAVEPOINT a")).tag == "RELEASE"  # type: ignore[union-attr]
        with pytest.raises(HeadraceError) as caught:
            await run_batch(client, "ROLLBACK TO b")
        assert caught.value.sqlstate == "3B001"
        await run(client, "ROLLBACK")

    asyncio.run(scenario())
