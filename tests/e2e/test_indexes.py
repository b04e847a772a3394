"""CREATE INDEX against a real server: point lookups on a table answered from the index's arrangement give
the same columns and values as DuckDB (text and binary), see writes at once, and psql's \\d lists the index."""

from __future__ import annotations

import os
import shutil
import subprocess

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess

pytestmark = pytest.mark.e2e


def lookups(conn: psycopg.Connection, k: int, *, binary: bool) -> tuple[list[tuple[str, int]], list[tuple]]:
    """The point lookup (fast path) and the same rows through DuckDB (`k + 0` is no index's equality)."""
    results = []
    for where in ("k = %s", "k + 0 = %s"):
        cursor = conn.cursor(binary=binary)
        cursor.execute(f"SELECT v, k, n FROM idx_kv WHERE {where}", (k,))
        assert cursor.description is not None
        results.append(([(d.name, d.type_code) for d in cursor.description], cursor.fetchall()))
    assert results[0] == results[1]
    return results[0]


def test_index_lookups_match_duckdb_and_see_writes(server: HeadraceProcess) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE idx_kv (k int PRIMARY KEY, v text, n bigint)")
        conn.execute("INSERT INTO idx_kv SELECT 1, 'one', 10")
        conn.execute("INSERT INTO idx_kv VALUES (2, 'two', NULL), (3, NULL, 30)")
        conn.execute("CREATE INDEX idx_kv_k ON idx_kv (k)")
        for k in (1, 2, 3, 4):
            for binary in (False, True):
                lookups(conn, k, binary=binary)
        assert lookups(conn, 2, binary=True)[1] == [("two", 2, None)]
        conn.execute("INSERT INTO idx_kv VALUES (4, 'four', 40)")
        assert lookups(conn, 4, binary=False)[1] == [("four", 4, 40)]  # read-your-writes through the index
        conn.execute("UPDATE idx_kv SET v = 'uno' WHERE k = 1")
        assert lookups(conn, 1, binary=False)[1] == [("uno", 1, 10)]
        conn.execute("DELETE FROM idx_kv WHERE k = 3")
        assert lookups(conn, 3, binary=False)[1] == []
        shown = [row for row in conn.execute("SHOW INDEXES").fetchall() if row[1] == "idx_kv"]  # a shared server
        assert shown == [("idx_kv_k", "idx_kv", "default", "{k}")]
        assert conn.execute("SELECT indexname, indexdef FROM pg_indexes WHERE indexname = 'idx_kv_k'").fetchall() == [
            ("idx_kv_k", "CREATE INDEX idx_kv_k ON public.idx_kv USING btree (k)")]


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed (scripts/bootstrap.sh)")
def test_psql_describe_lists_the_index_and_drop_removes_it(server: HeadraceProcess) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE idx_psql (id int PRIMARY KEY, name text)")
        conn.execute("CREATE INDEX idx_psql_name ON idx_psql (name)")
    env = {**os.environ, "PGHOST": "127.0.0.1", "PGPORT": str(server.pg_port), "PGUSER": "headrace",
           "PGDATABASE": "headrace"}
    described = subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=1", "-c", r"\d idx_psql"], env=env,
                               capture_output=True, text=True, timeout=60)
    assert described.returncode == 0, described.stderr
    assert '"idx_psql_name" btree (name)' in described.stdout, described.stdout
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("DROP INDEX idx_psql_name")
        with pytest.raises(psycopg.errors.UndefinedObject):
            conn.execute("DROP INDEX idx_psql_name")
        conn.execute("DROP INDEX IF EXISTS idx_psql_name")
        assert conn.execute("SELECT count(*) FROM pg_indexes WHERE indexname = 'idx_psql_name'").fetchone() == (0,)
