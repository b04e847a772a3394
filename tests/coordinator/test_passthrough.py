"""PostgreSQL's statements run on the store PostgreSQL (coordinator/passthrough.py), against a real PostgreSQL 15:
the answers are PostgreSQL's bytes, types and errors; headrace's own statements and relations stay headrace's."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from headrace.coordinator.client import AdapterClient, SessionClient
from headrace.coordinator.passthrough import StoreRoutes
from headrace.coordinator.responses import CommandComplete, CopyFrom, ExecuteResponse, SendingRows
from headrace.errors import HeadraceError, as_notice
from headrace.pgwire.types import BINARY_FORMAT, INT4, TEXT_FORMAT, raw_converter
from headrace.store.postgres_server import PostgresStore
from tests.coordinator.conftest import in_process_adapter
from tests.real_servers.postgres import new_store_database

@pytest.fixture
def adapter(tmp_path: Path) -> Iterator[AdapterClient]:
    """An in-process coordinator whose store is a fresh database in the tests' shared PostgreSQL cluster."""
    data = tmp_path / "data"
    data.mkdir()
    store = PostgresStore.open(data, new_store_database("passthrough"))
    with in_process_adapter(data, postgres=store) as client:
        yield client
        client._coordinator.passthrough.shutdown()  # type: ignore[attr-defined]
    store.stop()


def drive(adapter: AdapterClient, body: Callable[[SessionClient], Awaitable[None]]) -> None:
    """Run `body` with a new session of the superuser `headrace`, terminated afterwards."""
    async def main() -> None:
        session = await adapter.new_session("headrace", "headrace", {})
        try:
            await body(session)
        finally:
            await session.terminate()
    asyncio.run(main())


async def run(session: SessionClient, sql: str, params: tuple[object, ...] = (), *, describe: bool = False,
              result_formats: tuple[int, ...] = (), cancel: asyncio.Event | None = None) -> ExecuteResponse:
    """One statement as pgwire runs it (simple protocol unless `describe`); an error fails the block, as pgwire's
    ErrorResponse does."""
    try:
        await session.prepare("", sql, (), describe=describe)
        session.bind("", "", params, result_formats)
        return await session.execute("", 0, cancel or asyncio.Event())
    except HeadraceError:
        session.on_error()
        raise
    finally:
        session.on_sync()


async def rows(session: SessionClient, sql: str) -> list[tuple[object, ...]]:
    result = await run(session, sql)
    assert isinstance(result, SendingRows), result
    return [tuple(row) for row in result.rows]


def test_expressions_get_postgresql_answers_and_types(adapter: AdapterClient) -> None:
    async def body(session: SessionClient) -> None:
        result = await run(session, "SELECT 7/2 AS half, 10/3, '716'::numeric, 'infinity'::timestamp, pg_typeof(1.5), "
                                    "'{\"b\": 1, \"a\": 2}'::json, 1.5::float4")
        assert isinstance(result, SendingRows)
        assert [c.name for c in result.columns] == ["half", "?column?", "numeric", "timestamp", "pg_typeof", "json",
                                                    "float4"]
        assert [c.type_oid for c in result.columns] == [23, 23, 1700, 1114, 2206, 114, 700]
        assert result.rows == [(b"3", b"3", b"716", b"infinity", b"numeric", b'{"b": 1, "a": 2}', b"1.5")]
        assert result.command_tag == "SELECT 1"
    drive(adapter, body)


def test_errors_are_postgresqls(adapter: AdapterClient) -> None:
    async def body(session: SessionClient) -> None:
        with pytest.raises(HeadraceError) as bad_cast:
            await run(session, "SELECT 'abc'::int")
        assert (bad_cast.value.sqlstate, bad_cast.value.message) == \
            ("22P02", 'invalid input syntax for type integer: "abc"')
        with pytest.raises(HeadraceError) as division:
            await run(session, "SELECT 1/0")
        assert division.value.sqlstate == "22012"
        with pytest.raises(HeadraceError) as syntax:
            await run(session, "SELEC 1")
        assert (syntax.value.sqlstate, syntax.value.position) == ("42601", 1)
    drive(adapter, body)


def test_temporary_tables_plain_views_and_functions_live_in_the_store(adapter: AdapterClient) -> None:
    async def body(session: SessionClient) -> None:
        assert isinstance(await run(session, "CREATE TEMP TABLE scratch (a int, b text DEFAULT 'x')"), CommandComplete)
        inserted = await run(session, "INSERT INTO scratch (a) VALUES (1), (2) RETURNING a, b")
        assert isinstance(inserted, SendingRows) and inserted.rows == [(b"1", b"x"), (b"2", b"x")]
        assert inserted.command_tag == "INSERT 0 2"
        await run(session, "CREATE FUNCTION twice(x int) RETURNS int LANGUAGE sql AS $$ SELECT x * 2 $$")
        await run(session, "CREATE TEMP VIEW doubled AS SELECT twice(a) AS d FROM scratch")
        assert await rows(session, "SELECT d FROM doubled ORDER BY d") == [(b"2",), (b"4",)]
        explained = await run(session, "EXPLAIN (COSTS OFF) SELECT * FROM scratch")
        assert isinstance(explained, SendingRows) and explained.command_tag == "EXPLAIN"
        assert explained.rows == [(b"Seq Scan on scratch",)]
        other = await adapter.new_session("headrace", "headrace", {})
        with pytest.raises(HeadraceError) as unseen:  # a temporary table is its session's own
            await run(other, "SELECT * FROM scratch")
        assert unseen.value.sqlstate == "42P01"
        assert await rows(other, "SELECT twice(21)") == [(b"42",)]  # a function is the database's
        await other.terminate()
    drive(adapter, body)


def test_transaction_blocks_reach_the_store(adapter: AdapterClient) -> None:
    async def body(session: SessionClient) -> None:
        await run(session, "CREATE TEMP TABLE t_block (a int)")
        await run(session, "BEGIN")
        await run(session, "INSERT INTO t_block VALUES (1)")
        await run(session, "SAVEPOINT s")
        await run(session, "INSERT INTO t_block VALUES (2)")
        await run(session, "ROLLBACK TO SAVEPOINT s")
        await run(session, "COMMIT")
        assert await rows(session, "SELECT a FROM t_block") == [(b"1",)]
        await run(session, "BEGIN")
        await run(session, "INSERT INTO t_block VALUES (3)")
        with pytest.raises(HeadraceError):
            await run(session, "SELECT 1/0")
        with pytest.raises(HeadraceError) as aborted:
            await run(session, "SELECT 1")
        assert aborted.value.sqlstate == "25P02"
        await run(session, "ROLLBACK")
        assert await rows(session, "SELECT a FROM t_block") == [(b"1",)]
    drive(adapter, body)


def test_headrace_keeps_its_own_statements_and_relations(adapter: AdapterClient) -> None:
    async def body(session: SessionClient) -> None:
        await run(session, "CREATE TABLE kept (k int PRIMARY KEY, v text)")
        coordinator = adapter._coordinator  # type: ignore[attr-defined]
        assert coordinator.catalog.find_table("public", "kept") is not None  # a headrace table, fed to the pipeline
        result = await run(session, "SELECT k, v FROM kept")
        assert isinstance(result, SendingRows) and all(column.raw_format == -1 for column in result.columns)
        with pytest.raises(HeadraceError) as refused:  # headrace's grammar, headrace's error
            await run(session, "CREATE SOURCE oops FROM WEBHOOK BODY FORMAT NOPE")
        assert refused.value.sqlstate == "42601" and "NOPE" in refused.value.message
        catalog = await run(session, "SELECT relname FROM pg_class WHERE relname = 'kept'")
        assert isinstance(catalog, SendingRows) and [tuple(r) for r in catalog.rows] == [("kept",)]
    drive(adapter, body)


def test_settings_follow_the_session(adapter: AdapterClient) -> None:
    async def body(session: SessionClient) -> None:
        assert await rows(session, "SELECT 0.1::float8 + 0.2") == [(b"0.30000000000000004",)]
        await run(session, "SET extra_float_digits = 0")
        assert await rows(session, "SELECT 0.1::float8 + 0.2") == [(b"0.3",)]
        await run(session, "SET TimeZone = 'America/New_York'")
        assert await rows(session, "SELECT '2026-01-01 12:00:00+00'::timestamptz") == [(b"2026-01-01 07:00:00-05",)]
        await run(session, "SET enable_seqscan = off")  # PostgreSQL's parameter, unknown to headrace
        assert await rows(session, "SHOW enable_seqscan") == [(b"off",)]
        with pytest.raises(HeadraceError) as unknown:
            await run(session, "SET no_such_parameter = 1")
        assert unknown.value.sqlstate == "42704"
    drive(adapter, body)


def test_a_session_runs_as_its_role_never_as_a_superuser(adapter: AdapterClient) -> None:
    async def body(session: SessionClient) -> None:
        admin = await adapter.new_session("headrace", "headrace", {})
        await run(admin, "CREATE ROLE reader LOGIN")
        reader = await adapter.new_session("reader", "headrace", {})
        assert await rows(reader, "SELECT current_user, session_user") == [(b"reader", b"reader")]
        for sql in ("SELECT pg_read_file('/etc/passwd')", "ALTER SYSTEM SET work_mem = '1GB'",
                    "CREATE FUNCTION f() RETURNS int LANGUAGE c AS 'libc', 'abs'"):
            with pytest.raises(HeadraceError) as refused:  # PostgreSQL refuses: the role is no superuser
                await run(reader, sql)
            assert refused.value.sqlstate == "42501", sql
        with pytest.raises(HeadraceError) as refused:  # COPY is headrace's statement, and it has no PROGRAM
            await run(reader, "COPY (SELECT 1) TO PROGRAM 'true'")
        assert refused.value.sqlstate in ("42501", "0A000")
        for client in (reader, admin):
            await client.terminate()
    drive(adapter, body)


def test_parameters_and_formats_are_the_clients(adapter: AdapterClient) -> None:
    async def body(session: SessionClient) -> None:
        await session.prepare("p", "SELECT $1::int + 1 AS n, $2 AS t", ())
        description = session.describe_statement("p")
        assert description.param_types == (23, 25) and description.raw_parameters
        assert [(c.name, c.type_oid) for c in description.columns or ()] == [("n", 23), ("t", 25)]
        session.bind("", "p", [(TEXT_FORMAT, b"41"), (TEXT_FORMAT, b"x")], (BINARY_FORMAT,))
        result = await session.execute("", 0, asyncio.Event())
        assert isinstance(result, SendingRows) and result.rows == [(struct.pack("!i", 42), b"x")]
        session.on_sync()
        session.bind("", "p", [(TEXT_FORMAT, b"forty"), (TEXT_FORMAT, None)])
        with pytest.raises(HeadraceError) as bad:
            await session.execute("", 0, asyncio.Event())
        assert bad.value.sqlstate == "22P02"  # PostgreSQL decoded the parameter and refused it
        session.on_sync()
    drive(adapter, body)


def test_cancel_ends_the_running_statement(adapter: AdapterClient) -> None:
    async def body(session: SessionClient) -> None:
        cancel = asyncio.Event()
        asyncio.get_running_loop().call_later(0.3, cancel.set)
        began = time.monotonic()
        with pytest.raises(HeadraceError) as cancelled:
            await run(session, "SELECT pg_sleep(30)", cancel=cancel)
        assert cancelled.value.sqlstate == "57014" and time.monotonic() - began < 10
        assert await rows(session, "SELECT 1") == [(b"1",)]
    drive(adapter, body)


def test_mixed_formats_are_re_encoded_through_the_types_codec() -> None:
    assert raw_converter(INT4, TEXT_FORMAT, BINARY_FORMAT)(b"42") == struct.pack("!i", 42)
    assert raw_converter(INT4, BINARY_FORMAT, TEXT_FORMAT)(struct.pack("!i", -7)) == b"-7"
    with pytest.raises(HeadraceError) as unknown:
        raw_converter(600, TEXT_FORMAT, BINARY_FORMAT)  # point: no codec here
    assert unknown.value.sqlstate == "0A000"


def test_a_table_headrace_cannot_keep_is_the_stores(adapter: AdapterClient) -> None:
    async def body(session: SessionClient) -> None:
        created = await run(session, "CREATE TABLE counted (id serial PRIMARY KEY, a int UNIQUE CHECK (a > 0))")
        assert isinstance(created, CommandComplete) and created.tag == "CREATE TABLE"
        assert any("kept by the store PostgreSQL only" in as_notice(notice).message for notice in created.notices)
        coordinator = adapter._coordinator  # type: ignore[attr-defined]
        assert coordinator.catalog.find_table("public", "counted") is None
        inserted = await run(session, "INSERT INTO counted (a) VALUES (5), (7) RETURNING id")
        assert isinstance(inserted, SendingRows) and inserted.rows == [(b"1",), (b"2",)]
        with pytest.raises(HeadraceError) as check:
            await run(session, "INSERT INTO counted (a) VALUES (-1)")
        assert check.value.sqlstate == "23514"  # PostgreSQL's CHECK
        with pytest.raises(HeadraceError) as unique:
            await run(session, "INSERT INTO counted (a) VALUES (5)")
        assert unique.value.sqlstate == "23505"
        assert await rows(session, "SELECT count(*) FROM counted") == [(b"2",)]
        with pytest.raises(HeadraceError) as duplicate:  # a headrace relation's name stays headrace's
            await run(session, "CREATE TABLE kept2 (k int PRIMARY KEY)")
            await run(session, "CREATE TABLE kept2 (id serial)")
        assert duplicate.value.sqlstate == "42P07"
    drive(adapter, body)


def test_headraces_relations_and_the_stores_are_not_mixed_yet(adapter: AdapterClient) -> None:
    async def body(session: SessionClient) -> None:
        await run(session, "CREATE TABLE ours (k int PRIMARY KEY)")
        await run(session, "CREATE TEMP TABLE theirs (k int)")
        with pytest.raises(HeadraceError) as mixed:
            await run(session, "SELECT * FROM ours JOIN theirs USING (k)")
        assert mixed.value.sqlstate == "0A000" and "theirs" in mixed.value.message
        with pytest.raises(HeadraceError) as missing:  # nowhere at all: PostgreSQL's 42P01, as before
            await run(session, "SELECT * FROM ours JOIN nowhere USING (k)")
        assert missing.value.sqlstate == "42P01"
    drive(adapter, body)


def test_store_routes_remember_shapes_never_names() -> None:
    routes = StoreRoutes()
    routes.remember("generation 1", "SELECT 7/2, 'x''y' FROM \"t 1\" WHERE k = $1")
    assert routes.is_postgres("generation 1", "SELECT 8/3, 'z' FROM \"t 1\" WHERE k = $2")
    assert not routes.is_postgres("generation 1", "SELECT 8/3, 'z' FROM \"t 2\" WHERE k = $2")  # another name
    assert not routes.is_postgres("generation 2", "SELECT 7/2, 'x''y' FROM \"t 1\" WHERE k = $1")  # catalog moved
    routes.remember("generation 1", "SELECT E'\\\\'' FROM t")  # a backslash: literals not delimited safely
    assert not routes.is_postgres("generation 1", "SELECT E'\\\\'' FROM t")


def test_descriptions_are_kept_per_session_until_something_may_change_them(adapter: AdapterClient) -> None:
    async def body(session: SessionClient) -> None:
        await run(session, "CREATE TEMP TABLE d (a int)")
        coordinator = adapter._coordinator  # type: ignore[attr-defined]
        backend = next(iter(coordinator.passthrough._backends.values()))
        await run(session, "SELECT * FROM d", describe=True)
        assert ("SELECT * FROM d", ()) in backend.descriptions  # the next Parse of it costs no round trip
        first = backend.descriptions[("SELECT * FROM d", ())]
        await run(session, "SELECT * FROM d", describe=True)
        assert backend.descriptions[("SELECT * FROM d", ())] is first
        await run(session, "ALTER TABLE d ADD COLUMN b text")  # DDL on this backend: described anew
        assert not backend.descriptions
        result = await run(session, "SELECT * FROM d", describe=True)
        assert isinstance(result, SendingRows) and [c.name for c in result.columns] == ["a", "b"]
        # DDL elsewhere (here: behind the session's back, on its own backend): a stale description is refused
        await backend.connection.run("ALTER TABLE d ADD COLUMN c int")
        with pytest.raises(HeadraceError) as stale:
            await run(session, "SELECT * FROM d", describe=True)
        assert (stale.value.sqlstate, stale.value.message) == ("0A000", "cached plan must not change result type")
        result = await run(session, "SELECT * FROM d", describe=True)
        assert isinstance(result, SendingRows) and [c.name for c in result.columns] == ["a", "b", "c"]
        await run(session, "SET search_path = pg_catalog, public")  # names may resolve otherwise: forgotten
        await run(session, "SELECT 1", describe=True)
        assert list(backend.descriptions) == [("SELECT 1", ())]
    drive(adapter, body)


def test_copy_from_stdin_into_a_store_relation_is_postgresqls_copy(adapter: AdapterClient) -> None:
    async def body(session: SessionClient) -> None:
        await run(session, "CREATE TABLE kept (id serial PRIMARY KEY, n name, at timestamptz)")  # the store's only
        await session.prepare("", "COPY kept (n, at) FROM STDIN", ())
        session.bind("", "", (), ())
        started = await session.execute("", 0, asyncio.Event())
        assert isinstance(started, CopyFrom) and started.relay and len(started.columns) == 2
        done = await session.relay_copy(started, b"alpha\t2026-01-02 03:04:05+00\nbeta\t\\N\n")
        assert done.tag == "COPY 2"
        session.on_sync()
        assert await rows(session, "SELECT id, n::text, at IS NULL FROM kept ORDER BY id") == [
            (b"1", b"alpha", b"f"), (b"2", b"beta", b"t")]
        # PostgreSQL parses the data: its error, its SQLSTATE; the session goes on
        await session.prepare("", "COPY kept (n, at) FROM STDIN", ())
        session.bind("", "", (), ())
        started = await session.execute("", 0, asyncio.Event())
        with pytest.raises(HeadraceError) as bad:
            await session.relay_copy(started, b"gamma\tnot a time\n")  # type: ignore[arg-type]
        assert bad.value.sqlstate == "22007" and "not a time" in bad.value.message
        session.on_error()
        session.on_sync()
        # the client's CopyFail ends it with PostgreSQL's 57014
        await session.prepare("", "COPY kept (n) FROM STDIN", ())
        session.bind("", "", (), ())
        started = await session.execute("", 0, asyncio.Event())
        with pytest.raises(HeadraceError) as failed:
            await session.relay_copy(started, None, "client gave up")  # type: ignore[arg-type]
        assert failed.value.sqlstate == "57014" and "client gave up" in failed.value.message
        session.on_error()
        session.on_sync()
        # a COPY a client left mid-way (no data, no end) is ended before the next statement
        await session.prepare("", "COPY kept (n) FROM STDIN", ())
        session.bind("", "", (), ())
        await session.execute("", 0, asyncio.Event())
        session.on_sync()
        assert await rows(session, "SELECT count(*) FROM kept") == [(b"2",)]
        with pytest.raises(HeadraceError) as missing:  # not headrace's, not the store's: PostgreSQL's 42P01
            await run(session, "COPY nowhere FROM STDIN")
        assert missing.value.sqlstate == "42P01"
    drive(adapter, body)


def test_a_remembered_shape_keeps_the_headrace_relations_it_reads() -> None:
    routes = StoreRoutes()
    routes.remember("generation 1", "SELECT count(*) FROM events WHERE kind = 'a'", (("public", "events"),))
    assert routes.store_reads("generation 1", "SELECT count(*) FROM events WHERE kind = 'zz'") == (("public", "events"),)
    assert routes.store_reads("generation 1", "SELECT count(*) FROM other WHERE kind = 'a'") is None
    routes.remember("generation 1", "SELECT 1 + 1")
    assert routes.store_reads("generation 1", "SELECT 2 + 2") == ()
