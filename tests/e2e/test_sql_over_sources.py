"""SQL over webhook sources through real clients (psycopg, asyncpg, psql) and the webhook edge."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import uuid

import aiohttp
import asyncpg
import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def orders(server: HeadraceProcess) -> str:
    """A source with ten orders in it, visible."""
    name = f"orders_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SOURCE {name} FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id')")

    async def send() -> list[int]:
        async with aiohttp.ClientSession() as http:
            statuses = []
            for i in range(10):
                body = {"id": f"o{i}", "customer": f"c{i % 3}", "amount": i * 10, "nested": {"ok": i % 2 == 0}}
                async with http.post(server.webhook_url(name), data=json.dumps(body)) as response:
                    statuses.append(response.status)
            return statuses

    assert asyncio.run(send()) == [200] * 10
    wait_for(lambda: _scalar(server, f"SELECT count(*) FROM {name}") == 10, timeout=90, message="10 orders")
    return name


def _scalar(server: HeadraceProcess, sql: str, params: tuple = ()) -> object:  # type: ignore[type-arg]
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        return conn.execute(sql, params).fetchone()[0]


def test_select_where_group_order_limit(server: HeadraceProcess, orders: str) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT body->>'customer' AS customer, count(*), sum((body->>'amount')::int) AS total, "
            f"min((body->>'amount')::int), max((body->>'amount')::int) FROM {orders} "
            f"WHERE (body->>'amount')::int >= 10 GROUP BY 1 ORDER BY total DESC LIMIT 2").fetchall()
        assert [(r[0], r[1], int(r[2]), r[3], r[4]) for r in rows] == [("c0", 3, 180, 30, 90), ("c2", 3, 150, 20, 80)]
        nested = conn.execute(f"SELECT count(*) FROM {orders} WHERE (body->'nested'->>'ok')::boolean").fetchone()[0]
        assert nested == 5
        cursor = conn.execute(f"SELECT body, received_at, idempotency_key, now() >= received_at FROM {orders} LIMIT 1")
        assert [d.name for d in cursor.description] == ["body", "received_at", "idempotency_key", "?column?"]
        body, received_at, key, recent = cursor.fetchone()
        assert isinstance(body, dict) and body["id"] == key and received_at.tzinfo is not None and recent is True


def test_parameterized_queries_psycopg_and_asyncpg(server: HeadraceProcess, orders: str) -> None:
    with psycopg.connect(server.dsn) as conn:  # not autocommit: psycopg opens a transaction with BEGIN
        total = conn.execute(f"SELECT sum((body->>'amount')::int) FROM {orders} WHERE body->>'customer' = %s",
                             ("c1",)).fetchone()[0]
        assert int(total) == 10 + 40 + 70
        conn.commit()

    async def with_asyncpg() -> None:
        conn = await asyncpg.connect(host="127.0.0.1", port=server.pg_port, user="headrace", database="headrace")
        try:
            rows = await conn.fetch(f"SELECT idempotency_key FROM {orders} WHERE (body->>'amount')::int > $1::int "
                                    f"ORDER BY 1 LIMIT $2", 60, 5)
            assert [r[0] for r in rows] == ["o7", "o8", "o9"]
            assert await conn.fetchval(f"SELECT count(*) FROM {orders} WHERE body->>'id' = $1", "o3") == 1
        finally:
            await conn.close()

    asyncio.run(with_asyncpg())


def test_errors_carry_sqlstates(server: HeadraceProcess) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute("SELECT * FROM no_such_source")
        with pytest.raises(psycopg.errors.SyntaxError):
            conn.execute("SELEC 1")
        with pytest.raises(psycopg.errors.UndefinedColumn):
            conn.execute("CREATE SOURCE bad FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (nope->>'x')")
        assert conn.execute("SELECT 1").fetchone()[0] == 1  # the connection survives errors


def test_webhook_statuses_and_lifecycle(server: HeadraceProcess) -> None:
    name = f"life_{uuid.uuid4().hex[:6]}"

    async def request(method: str, body: bytes, source: str = name) -> int:
        async with aiohttp.ClientSession() as http:
            async with http.request(method, server.webhook_url(source), data=body) as response:
                return response.status

    assert asyncio.run(request("POST", b"{}", source="never_created")) == 404
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SOURCE {name} FROM WEBHOOK BODY FORMAT JSON")
        with pytest.raises(psycopg.errors.DuplicateTable):
            conn.execute(f"CREATE SOURCE {name} FROM WEBHOOK BODY FORMAT JSON")
        assert (name, "webhook") in conn.execute("SHOW SOURCES").fetchall()
    assert asyncio.run(request("POST", b"not json")) == 400
    assert asyncio.run(request("GET", b"")) == 405
    assert asyncio.run(request("POST", b'{"a": 1}')) == 200
    assert asyncio.run(request("POST", b'{"a": 1}')) == 200  # no IDEMPOTENT: two rows
    wait_for(lambda: _scalar(server, f"SELECT count(*) FROM {name}") == 2, timeout=90, message="2 rows")
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        columns = [d.name for d in conn.execute(f"SELECT * FROM {name}").description]
        assert columns == ["body", "received_at"]
        conn.execute(f"DROP SOURCE {name}")
        conn.execute(f"DROP SOURCE IF EXISTS {name}")
        assert (name, "webhook") not in conn.execute("SHOW SOURCES").fetchall()
    assert asyncio.run(request("POST", b"{}")) == 404


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql not installed")
def test_psql_connects(server: HeadraceProcess, orders: str) -> None:
    result = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", str(server.pg_port), "-U", "headrace", "headrace", "-At",
         "-c", f"SELECT count(*) FROM {orders}"],
        capture_output=True, text=True, timeout=30, env={"PGCONNECT_TIMEOUT": "5", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "10"
