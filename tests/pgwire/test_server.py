"""Real clients over a real socket: psycopg 3 (libpq; text and binary results, pipelines, cancel)
and asyncpg (binary everything, Parse/Describe/Flush, cursors with PortalSuspended), against
start_pgwire_server on 127.0.0.1 with an OS-assigned port and the scripted coordinator."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import asyncpg
import psycopg
import pytest
from psycopg.types.json import Jsonb

from headrace.pgwire.server import start_pgwire_server

from .scripted_session import EVERYTHING, ScriptedAdapter

EXPECTED_EVERYTHING: dict[str, Any] = {name: value for name, _, value in EVERYTHING} | {
    "j": {"a": [1, 2]}, "jb": {"k": "v"},  # psycopg parses json; the session sent a dict and JSON text
}


class BackgroundServer:
    """The pgwire server on its own event loop thread, so the synchronous psycopg can talk to it."""

    def __init__(self) -> None:
        self.adapter = ScriptedAdapter()
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(start_pgwire_server(self.adapter, "127.0.0.1", 0))
            ready.set()
            try:
                self._loop.run_forever()
            finally:
                self._loop.run_until_complete(self._loop.shutdown_asyncgens())
                self._loop.close()

        self._thread = threading.Thread(target=serve, name="pgwire-test-server", daemon=True)
        self._thread.start()
        assert ready.wait(5), "server did not start"
        self.port: int = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        async def shutdown() -> None:
            self._server.close()
            await self._server.wait_closed()
        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    background = BackgroundServer()
    yield background
    background.stop()


def connect(server: BackgroundServer, **kwargs: Any) -> psycopg.Connection[Any]:
    return psycopg.connect(host="127.0.0.1", port=server.port, user="headrace", dbname="headrace",
                           autocommit=kwargs.pop("autocommit", True), connect_timeout=5, **kwargs)


# --- psycopg 3 ----------------------------------------------------------------------------------

def test_psycopg_parameterized_query(server: BackgroundServer) -> None:
    with connect(server) as conn:
        assert conn.execute("SELECT %s::int4, %s::text", (5, "héllo")).fetchone() == (5, "héllo")
        assert conn.info.parameter_status("server_version") == "16.0"
        assert conn.info.backend_pid >= 1


@pytest.mark.parametrize("binary", [False, True])
def test_psycopg_decodes_every_type(server: BackgroundServer, binary: bool) -> None:
    with connect(server) as conn:
        cursor = conn.cursor(binary=binary)
        row = cursor.execute("SELECT everything").fetchone()
        assert cursor.description is not None and row is not None
        assert dict(zip([column.name for column in cursor.description], row, strict=True)) == EXPECTED_EVERYTHING


@pytest.mark.parametrize("placeholder", ["%s", "%b", "%t"])
def test_psycopg_parameters_round_trip(server: BackgroundServer, placeholder: str) -> None:
    values: list[Any] = [
        datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=timezone.utc), timedelta(days=-1, seconds=5),
        Decimal("-1.2300"), uuid.UUID(int=7), b"\x00\xff", [1, None, 3], Jsonb({"a": [1]}), date(2026, 1, 2),
        True, 2.5, 2**40, "text",
    ]
    casts = ["timestamptz", "interval", "numeric", "uuid", "bytea", "int4[]", "jsonb", "date", "bool",
             "float8", "int8", "text"]
    sql = "SELECT " + ", ".join(f"{placeholder}::{cast}" for cast in casts)
    with connect(server) as conn:
        row = conn.execute(sql, values).fetchone()
    assert row is not None
    expected = [*values[:6], {"a": [1]}, *values[7:]]
    assert list(row) == expected


def test_psycopg_errors_transactions_and_prepared_statements(server: BackgroundServer) -> None:
    with connect(server) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        with pytest.raises(psycopg.errors.SyntaxError):
            conn.execute("SELEC %s::int4", (1,))
        for _ in range(3):  # psycopg prepares server-side on the repeat
            assert conn.execute("SELECT %s::int4", (1,), prepare=True).fetchone() == (1,)
    with connect(server, autocommit=False) as conn:  # psycopg sends BEGIN itself
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.commit()
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_psycopg_pipeline(server: BackgroundServer) -> None:
    with connect(server) as conn:
        with conn.cursor() as cursor:
            cursor.executemany("SELECT %s::int4", [(n,) for n in range(50)], returning=True)
            results = []
            while True:
                results.append(cursor.fetchone())
                if not cursor.nextset():
                    break
        assert results == [(n,) for n in range(50)]


def test_psycopg_cancel(server: BackgroundServer) -> None:
    with connect(server) as conn:
        session = server.adapter.sessions[conn.info.backend_pid]

        def cancel_soon() -> None:
            deadline = time.monotonic() + 5
            while session.running is None and time.monotonic() < deadline:  # wait for the execute
                time.sleep(0.01)
            conn.cancel_safe()  # a CancelRequest on a new connection

        canceller = threading.Thread(target=cancel_soon)
        canceller.start()
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep")
        canceller.join()
        assert time.monotonic() - started < 5
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the connection survives


# --- asyncpg ------------------------------------------------------------------------------------

async def asyncpg_connect(server: BackgroundServer) -> asyncpg.Connection:
    return await asyncpg.connect(host="127.0.0.1", port=server.port, user="headrace", database="headrace",
                                 ssl=False, timeout=5)


def test_asyncpg_fetch(server: BackgroundServer) -> None:
    async def scenario() -> None:
        conn = await asyncpg_connect(server)
        try:
            assert [tuple(record) for record in await conn.fetch("SELECT $1::int4", 5)] == [(5,)]
            assert await conn.fetchval("SELECT $1::text", "héllo") == "héllo"
            assert await conn.fetchval("SELECT 1") == 1
        finally:
            await conn.close()
    asyncio.run(scenario())


def test_asyncpg_decodes_every_type_in_binary(server: BackgroundServer) -> None:
    # asyncpg has built-in codecs for text[] but not int4[]: for those it would first run its
    # pg_type introspection query, which only the real coordinator can answer.
    async def scenario() -> dict[str, Any]:
        conn = await asyncpg_connect(server)
        try:
            return dict(await conn.fetchrow("SELECT everything but int arrays"))
        finally:
            await conn.close()
    row = asyncio.run(scenario())
    expected = {name: value for name, value in EXPECTED_EVERYTHING.items() if name != "ints"} | {
        "j": '{"a": [1, 2]}', "jb": '{"k": "v"}'}  # asyncpg keeps JSON as text
    assert {name: str(value) if name == "u" else value for name, value in row.items()} == \
        expected | {"u": str(expected["u"])}


def test_asyncpg_binary_parameters_round_trip(server: BackgroundServer) -> None:
    values: list[Any] = [
        datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=timezone.utc), datetime(2026, 11, 21, 10, 0),
        timedelta(days=2, microseconds=-1), Decimal("123456789.000001"), uuid.UUID(int=9), b"\x00\x01",
        ["a", None, "c d"], '{"x": 1}', date(1999, 12, 31), False, 0.1, -(2**63), 7, 1.5, "é",
    ]
    sql = ("SELECT $1::timestamptz, $2::timestamp, $3::interval, $4::numeric, $5::uuid, $6::bytea, "
           "$7::text[], $8::jsonb, $9::date, $10::bool, $11::float8, $12::int8, $13::int2, $14::float4, "
           "$15::varchar")

    async def scenario() -> list[Any]:
        conn = await asyncpg_connect(server)
        try:
            return list(await conn.fetchrow(sql, *values))
        finally:
            await conn.close()
    row = asyncio.run(scenario())
    assert [str(value) if isinstance(value, uuid.UUID) else value for value in row] == \
        [str(value) if isinstance(value, uuid.UUID) else value for value in values]


def test_asyncpg_errors_transactions_and_cursors(server: BackgroundServer) -> None:
    async def scenario() -> None:
        conn = await asyncpg_connect(server)
        try:
            with pytest.raises(asyncpg.exceptions.DivisionByZeroError):
                await conn.fetchval("SELECT 1/0")
            with pytest.raises(asyncpg.exceptions.PostgresSyntaxError):
                await conn.fetchval("SELEC 1")
            assert await conn.fetchval("SELECT 1") == 1
            statement = await conn.prepare("SELECT * FROM numbers")
            assert [record["n"] for record in await statement.fetch()] == [1, 2, 3, 4, 5]
            async with conn.transaction():
                rows = [record["n"] async for record in conn.cursor("SELECT * FROM numbers", prefetch=2)]
            assert rows == [1, 2, 3, 4, 5]
            assert conn.is_in_transaction() is False
        finally:
            await conn.close()
    asyncio.run(scenario())
