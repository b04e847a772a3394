"""asyncpg against a real server: connect (server settings), prepared statements with binary results
for the common types (typed parameters need real OIDs), its type introspection for arrays, a transaction."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import uuid

import asyncpg
import pytest

from tests.e2e.server_process import HeadraceProcess

pytestmark = pytest.mark.e2e


def run(server: HeadraceProcess, body):  # type: ignore[no-untyped-def]
    async def main():  # type: ignore[no-untyped-def]
        conn = await asyncpg.connect(host="127.0.0.1", port=server.pg_port, user="headrace", database="headrace")
        try:
            return await body(conn)
        finally:
            await conn.close()
    return asyncio.run(main())


def test_prepared_statement_binary_results(server: HeadraceProcess) -> None:
    moment = datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.timezone.utc)

    async def body(conn: asyncpg.Connection) -> asyncpg.Record:
        statement = await conn.prepare(
            "SELECT $1::bool AS b, $2::int2 AS i2, $3::int4 AS i4, $4::int8 AS i8, $5::float4 AS f4, "
            "$6::float8 AS f8, $7::text AS t, $8::varchar AS v, $9::bytea AS by, $10::date AS d, "
            "$11::timestamp AS ts, $12::timestamptz AS tz, $13::interval AS iv, $14::uuid AS u, "
            "$15::jsonb AS jb, $16::json AS j, $17::int8[] AS ai, $18::text[] AS at")
        assert [t.name for t in statement.get_parameters()] == [
            "bool", "int2", "int4", "int8", "float4", "float8", "text", "varchar", "bytea", "date", "timestamp",
            "timestamptz", "interval", "uuid", "jsonb", "json", "int8[]", "text[]"]
        return await statement.fetchrow(
            True, 2, 4, 8, 1.5, 2.25, "text", "varchar", b"\x00\xff", datetime.date(2024, 5, 6),
            moment.replace(tzinfo=None), moment, datetime.timedelta(days=1, seconds=2), uuid.UUID(int=7),
            '{"a": 1}', '{"b": 2}', [1, 2, None], ["x", "y"])

    row = run(server, body)
    assert dict(row) == {
        "b": True, "i2": 2, "i4": 4, "i8": 8, "f4": 1.5, "f8": 2.25, "t": "text", "v": "varchar", "by": b"\x00\xff",
        "d": datetime.date(2024, 5, 6), "ts": moment.replace(tzinfo=None), "tz": moment,
        "iv": datetime.timedelta(days=1, seconds=2), "u": uuid.UUID(int=7), "jb": '{"a": 1}', "j": '{"b": 2}',
        "ai": [1, 2, None], "at": ["x", "y"]}


def test_numeric_and_settings(server: HeadraceProcess) -> None:
    async def body(conn: asyncpg.Connection) -> tuple[object, ...]:
        number = await conn.fetchval("SELECT $1::numeric + 1", decimal.Decimal("1.25"))
        return number, conn.get_server_version(), await conn.fetchval("SELECT current_setting('TimeZone')")

    number, version, timezone = run(server, body)
    assert number == decimal.Decimal("2.25")
    assert (version.major, version.minor) == (15, 0)
    assert timezone == "UTC"


def test_type_introspection_and_transaction(server: HeadraceProcess) -> None:
    """oid[] has no built-in codec in asyncpg: it runs its introspection query over pg_type."""
    async def body(conn: asyncpg.Connection) -> tuple[object, ...]:
        oids = await conn.fetchval("SELECT $1::oid[]", [23, 25])
        async with conn.transaction():
            in_block = await conn.fetchval("SELECT count(*) FROM pg_catalog.pg_type WHERE typname = $1", "jsonb")
        return oids, in_block

    oids, in_block = run(server, body)
    assert oids == [23, 25]
    assert in_block == 1


def test_untyped_parameters_take_the_column_type(server: HeadraceProcess) -> None:
    """asyncpg encodes each argument by the type Describe reports: `k = $1` must say int4 (as PostgreSQL
    infers it), or asyncpg refuses a Python int. The same lookup through an index takes the fast path."""
    async def body(conn: asyncpg.Connection) -> tuple[object, ...]:
        await conn.execute("CREATE TABLE apg_typed (k int PRIMARY KEY, v text, d date)")
        await conn.execute("INSERT INTO apg_typed VALUES (1, 'one', '2024-01-02'), (2, 'two', '2024-03-04')")
        scanned = await conn.fetch("SELECT v FROM apg_typed WHERE k = $1 OR d > $2 ORDER BY v", 1,
                                   datetime.date(2024, 3, 1))
        await conn.execute("CREATE INDEX apg_typed_k ON apg_typed (k)")
        statement = await conn.prepare("SELECT v, d FROM apg_typed WHERE k = $1")
        looked_up = [await statement.fetchrow(k) for k in (2, 1, 3)]
        return [row["v"] for row in scanned], [tuple(row) if row else None for row in looked_up]

    scanned, looked_up = run(server, body)
    assert scanned == ["one", "two"]
    assert looked_up == [("two", datetime.date(2024, 3, 4)), ("one", datetime.date(2024, 1, 2)), None]
