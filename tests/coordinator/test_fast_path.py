"""Indexes and the fast path through a real coordinator and DuckDB serving store (no Spark): every query the
fast path answers is also run in DuckDB (the same statement with the index dropped) and must give the same
columns and rows. Commits are written as the serving driver writes them, then announced (note_committed)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.coordinator.client import AdapterClient, SessionClient
from headrace.coordinator.fast_path import FastStatement, normalize_literals
from headrace.coordinator.responses import CommandComplete, SendingRows
from headrace.errors import HeadraceError
from headrace.store.serving import changelog_table, qualified_name
from tests.coordinator.conftest import new_client, run

SOURCE = ("CREATE SOURCE kv FROM WEBHOOK BODY FORMAT JSON INCLUDE HEADER 'x-tenant' AS tenant "
          "IDEMPOTENT (body->>'k')")


def commit(client: SessionClient, inserts: list[tuple[int, str, str | None, dict[str, Any]]],
           deletes: list[int] = ()) -> None:
    """Rows (log_offset, idempotency_key, tenant, body), as the serving driver stores them."""
    coordinator = client._coordinator  # type: ignore[attr-defined]
    item = coordinator.catalog.find("public", "kv")
    path = ("headrace_internal", item.materialization)
    store = coordinator.resources.store
    timestamp = store.next_commit_timestamp()
    columns = "log_offset, idempotency_key, tenant, body, received_at"
    with store.cursor() as cursor:
        cursor.begin()
        for offset in deletes:
            cursor.execute(f"INSERT INTO {changelog_table(path)} (hr_timestamp, hr_diff, {columns}) "
                           f"SELECT ?, -1, {columns} FROM {qualified_name(path)} WHERE log_offset = ?",
                           [timestamp, offset])
            cursor.execute(f"DELETE FROM {qualified_name(path)} WHERE log_offset = ?", [offset])
        for offset, key, tenant, body in inserts:
            values = [offset, key, tenant, json.dumps(body), "2026-01-01 00:00:00+00"]
            cursor.execute(f"INSERT INTO {qualified_name(path)} ({columns}) VALUES (?, ?, ?, ?, ?)", values)
            cursor.execute(f"INSERT INTO {changelog_table(path)} (hr_timestamp, hr_diff, {columns}) "
                           "VALUES (?, 1, ?, ?, ?, ?, ?)", [timestamp, *values])
        cursor.execute("INSERT OR REPLACE INTO headrace_internal.checkpoints VALUES (?, 0, 1, 1, '{}', ?)",
                       [item.materialization, timestamp])
        cursor.commit()
    store.note_committed()


async def select(client: SessionClient, sql: str, params: tuple[Any, ...] = ()) -> tuple[Any, list[tuple]]:
    """(columns, sorted rows) and whether the fast path prepared it."""
    await client.prepare("", sql, ())
    client.bind("", "", params)
    result = await client.execute("", 0, asyncio.Event())
    assert isinstance(result, SendingRows)
    return result.columns, sorted(result.rows, key=repr)


def is_fast(client: SessionClient) -> bool:
    return isinstance(client.session.statements[""], FastStatement)


QUERIES = [
    ("SELECT body->>'v' FROM kv WHERE idempotency_key = 'k1'", ()),
    ("SELECT body->>'v' FROM kv WHERE idempotency_key = 2::text", ()),
    ("SELECT body->>'v' FROM kv WHERE idempotency_key = $1::text", ("k3",)),
    ("SELECT * FROM kv WHERE idempotency_key = $1", ("k1",)),
    ("SELECT t.body, t.tenant AS who FROM kv AS t WHERE t.idempotency_key = 'k4' AND tenant = 'a'", ()),
    ("SELECT body->>'n', body->>'flag', body->>'missing', body->>'nested' FROM kv WHERE 'k5' = idempotency_key", ()),
    ("SELECT body->>'f' FROM kv WHERE idempotency_key = 'k5'", ()),  # a float: declined, DuckDB answers
    ("SELECT body->>'v' FROM kv WHERE idempotency_key = 'absent'", ()),
    ("SELECT body->>'v' FROM kv WHERE idempotency_key = NULL", ()),
    ("SELECT tenant FROM kv WHERE idempotency_key = 'k''6'", ()),
]
FAST = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}


def test_fast_path_answers_exactly_as_duckdb(adapter: AdapterClient) -> None:
    async def scenario() -> None:
        client = await new_client(adapter)
        await run(client, SOURCE)
        commit(client, [(1, "k1", "a", {"v": "one"}), (2, "2", "b", {"v": "two"}), (3, "k3", None, {"v": None}),
                        (4, "k4", "a", {"v": "four", "z": [1, 2]}), (5, "k5", "c",
                        {"n": 7, "flag": True, "f": 1.5, "nested": "x"}), (6, "k'6", "d", {})])
        expected = {sql: await select(client, sql, params) for sql, params in QUERIES}
        assert isinstance(await run(client, "CREATE INDEX kv_key ON kv (idempotency_key)"), CommandComplete)
        for number, (sql, params) in enumerate(QUERIES):
            assert await select(client, sql, params) == expected[sql], sql
            assert is_fast(client) == (number in FAST), sql
        coordinator = client._coordinator  # type: ignore[attr-defined]
        assert coordinator.fast_path.declined >= 1 and coordinator.fast_path.answered >= 8

        # changes after the index was built are seen by the very next read
        commit(client, [(7, "k1", "z", {"v": "new one"})], deletes=[1])
        assert await select(client, "SELECT tenant, body->>'v' FROM kv WHERE idempotency_key = 'k1'") == \
            await select(client, "SELECT tenant, body->>'v' FROM kv WHERE idempotency_key || '' = 'k1'")
        assert (await select(client, "SELECT body->>'v' FROM kv WHERE idempotency_key = 'k1'"))[1] == [("new one",)]

        shown = await run(client, "SHOW INDEXES")
        assert isinstance(shown, SendingRows) and list(shown.rows) == [("kv_key", "kv", "default", "{idempotency_key}")]
        await run(client, "DROP INDEX kv_key")
        assert (await select(client, "SELECT body->>'v' FROM kv WHERE idempotency_key = 'k4'"))[1] == [("four",)]
        assert not is_fast(client)

    asyncio.run(scenario())


def test_simple_protocol_texts_of_one_shape_reuse_the_analysis(adapter: AdapterClient) -> None:
    async def scenario() -> None:
        client = await new_client(adapter)
        await run(client, SOURCE)
        commit(client, [(i, str(i), "t", {"v": f"value-{i}"}) for i in range(1, 50)])
        await run(client, "CREATE INDEX ON kv (idempotency_key)")
        for k in range(1, 50):
            columns, rows = await select(client, f"SELECT body->>'v' FROM kv WHERE idempotency_key = {k}::text")
            assert rows == [(f"value-{k}",)] and is_fast(client)
            assert columns[0].name == "?column?"
        # another literal elsewhere in the text is another statement, not the same shape with new values
        assert (await select(client, "SELECT body->>'x' FROM kv WHERE idempotency_key = 3::text"))[1] == [(None,)]
        with pytest.raises(HeadraceError) as error:
            await run(client, "CREATE INDEX ON kv (idempotency_key)")
        assert error.value.sqlstate == "42P07"
        assert isinstance(await run(client, "CREATE INDEX IF NOT EXISTS kv_idempotency_key_idx ON kv (idempotency_key)"),
                          CommandComplete)
        with pytest.raises(HeadraceError) as error:
            await run(client, "CREATE INDEX ON kv (nope)")
        assert error.value.sqlstate == "42703"

    asyncio.run(scenario())


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab1'\" -$.e\\", max_size=30))
def test_normalized_literals_rebuild_the_text(text: str) -> None:
    normalized = normalize_literals(f"SELECT x FROM t WHERE k = {text}")
    if normalized is None:
        return
    template, literals = normalized
    pieces = template.split("?")
    assert len(pieces) == len(literals) + 1
    assert "".join(piece + literal for piece, literal in zip(pieces, [*literals, ""])) == \
        f"SELECT x FROM t WHERE k = {text}"


def test_a_prepared_lookup_fails_like_duckdb_once_its_relation_is_dropped(adapter: AdapterClient) -> None:
    async def scenario() -> None:
        client = await new_client(adapter)
        await run(client, SOURCE)
        commit(client, [(1, "k1", "a", {"v": "one"})])
        await run(client, "CREATE INDEX ON kv (idempotency_key)")
        await client.prepare("lookup", "SELECT tenant FROM kv WHERE idempotency_key = $1", ())
        assert isinstance(client.session.statements["lookup"], FastStatement)
        client.bind("", "lookup", ("k1",))
        assert list((await client.execute("", 0, asyncio.Event())).rows) == [("a",)]  # type: ignore[union-attr]
        await run(client, "DROP SOURCE kv")
        await asyncio.sleep(0.3)  # the arrangement's tail notices within one tick
        client.bind("", "lookup", ("k1",))
        with pytest.raises(HeadraceError) as error:
            await client.execute("", 0, asyncio.Event())
        assert error.value.sqlstate == "42P01"

    asyncio.run(scenario())
