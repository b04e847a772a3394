"""Session-level SQL through real clients against a real server: server-side cursors, prepared
statements, executemany, transactions, variables and cancellation (psycopg 3, asyncpg, psql)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
import time

import asyncpg
import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess

pytestmark = pytest.mark.e2e

SERIES = "SELECT n, n * 10 AS tens FROM generate_series(1, 50) AS t(n)"


def test_psycopg_server_side_cursor(server: HeadraceProcess) -> None:
    with psycopg.connect(server.dsn) as conn:  # psycopg runs DECLARE inside its own BEGIN
        with conn.cursor(name="tens") as cursor:
            cursor.itersize = 7
            cursor.execute(SERIES)
            assert cursor.fetchone() == (1, 10)
            assert cursor.fetchmany(3) == [(2, 20), (3, 30), (4, 40)]
            assert [d.name for d in cursor.description] == ["n", "tens"]
            rest = list(cursor)  # FETCH FORWARD itersize until empty
            assert len(rest) == 46 and rest[-1] == (50, 500)
        conn.commit()
        with conn.cursor(name="held", withhold=True) as cursor:
            cursor.execute(SERIES)
            conn.commit()  # a WITH HOLD cursor outlives its transaction
            assert len(cursor.fetchall()) == 50


def test_sql_cursors_and_prepared_statements(server: HeadraceProcess) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.NoActiveSqlTransaction):
            conn.execute(f"DECLARE c CURSOR FOR {SERIES}")
        conn.execute("BEGIN")
        conn.execute(f"DECLARE c CURSOR FOR {SERIES}")
        cursor = conn.execute("FETCH 3 FROM c")
        assert cursor.fetchall() == [(1, 10), (2, 20), (3, 30)] and cursor.statusmessage == "FETCH 3"
        assert len(conn.execute("FETCH ALL c").fetchall()) == 47
        conn.execute("CLOSE c")
        with pytest.raises(psycopg.errors.InvalidCursorName):
            conn.execute("FETCH c")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute("SELECT 1")
        conn.execute("ROLLBACK")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

        conn.execute("PREPARE double_it (int) AS SELECT $1 * 2 AS doubled")
        assert conn.execute("EXECUTE double_it (21)").fetchone() == (42,)
        conn.execute("DEALLOCATE double_it")
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            conn.execute("EXECUTE double_it (1)")


def test_psycopg_executemany_prepared_and_variables(server: HeadraceProcess) -> None:
    with psycopg.connect(server.dsn, autocommit=True, prepare_threshold=0) as conn:
        cursor = conn.cursor()
        cursor.executemany("SELECT %s::int + 1", [(n,) for n in range(20)], returning=True)
        results = []
        while True:
            results.append(cursor.fetchone()[0])
            if not cursor.nextset():
                break
        assert results == list(range(1, 21))
        for n in range(5):  # server-side prepared statements (named), reused
            assert conn.execute("SELECT %s::text || 'x'", (str(n),)).fetchone() == (f"{n}x",)
        conn.execute("SET extra_float_digits = 3")
        assert conn.execute("SHOW extra_float_digits").fetchone() == ("3",)
        conn.execute("RESET ALL")
        assert conn.execute("SHOW extra_float_digits").fetchone() == ("1",)
        conn.execute("DISCARD ALL")
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_cancel_a_running_statement(server: HeadraceProcess) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        timer = threading.Timer(0.5, conn.cancel)
        timer.start()
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled, match="canceling statement due to user request"):
            conn.execute("SELECT count(*) FROM generate_series(1, 100000000000)")
        timer.join()
        assert time.monotonic() - started < 10
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_asyncpg_prepared_binary_cursor_transaction(server: HeadraceProcess) -> None:
    async def body() -> None:
        conn = await asyncpg.connect(host="127.0.0.1", port=server.pg_port, user="headrace", database="headrace")
        try:
            statement = await conn.prepare("SELECT $1::int8 * 2 AS doubled, $2::text AS label")
            assert [tuple(r) for r in await statement.fetch(21, "x")] == [(42, "x")]
            async with conn.transaction():
                total = 0
                async for record in conn.cursor(SERIES, prefetch=8):
                    total += record["tens"]
                assert total == sum(n * 10 for n in range(1, 51))
                cursor = await conn.cursor(SERIES)
                assert [r["n"] for r in await cursor.fetch(3)] == [1, 2, 3]
                assert (await cursor.fetchrow())["n"] == 4
            assert await conn.fetchval("SELECT 7") == 7
        finally:
            await conn.close()

    asyncio.run(body())


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql not installed")
def test_psql_session_commands(server: HeadraceProcess) -> None:
    script = "\n".join([
        "BEGIN;",
        f"DECLARE c CURSOR FOR {SERIES};",
        "FETCH 2 c;",
        "COMMIT;",
        "PREPARE p AS SELECT 'prepared' AS what;",
        "EXECUTE p;",
        "SET application_name = 'psql-test';",
        "SHOW application_name;",
    ])
    result = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", str(server.pg_port), "-U", "headrace", "headrace", "-At",
         "-v", "ON_ERROR_STOP=1", "-f", "-"],
        input=script, capture_output=True, text=True, timeout=30,
        env={"PGCONNECT_TIMEOUT": "5", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["BEGIN", "DECLARE", "CURSOR", "1|10", "2|20", "COMMIT", "PREPARE", "prepared",
                                     "SET", "psql-test"]
