"""CREATE INDEX on the PostgreSQL serving store: point lookups are answered from the index's arrangement (counted
on /metrics), with the columns and values PostgreSQL gives for the same query, in text and binary, through the
extended and the simple protocol; they see writes at once; what the index cannot answer exactly (a value
PostgreSQL refuses, a lookup inside a transaction block) PostgreSQL answers, with its own errors."""

from __future__ import annotations

import re
from decimal import Decimal
import urllib.request

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess, wait_for

pytestmark = pytest.mark.e2e


def answered_by_index(server: HeadraceProcess) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.search(r'^headrace_index_lookups_total\{outcome="answered"\} (\S+)$', text, re.MULTILINE)
    assert found is not None, text
    return int(float(found.group(1)))


def wait_until_applied(conn: psycopg.Connection, table: str) -> None:
    """The table's first write applied: its streaming query may take longer to start than one read waits (60 s)
    on a loaded machine."""
    def applied() -> bool:
        try:
            return conn.execute(f"SELECT count(*) > 0 FROM {table}").fetchone() == (True,)
        except psycopg.errors.CannotConnectNow:
            return False
    wait_for(applied, 300, message=f"{table}'s first write applied")


def lookup_and_store(conn: psycopg.Connection, k: object, *, binary: bool) -> list[tuple]:
    """The point lookup (the index) and the same rows computed by PostgreSQL (`k + 0` is no index's equality)."""
    results = []
    for where in ("k = %s", "k + 0 = %s"):
        cursor = conn.cursor(binary=binary)
        cursor.execute(f"SELECT v, k, n, price FROM pgidx_kv WHERE {where}", (k,))
        assert cursor.description is not None
        results.append(([(d.name, d.type_code, d.internal_size) for d in cursor.description], cursor.fetchall()))
    assert results[0] == results[1]
    return results[0][1]


def test_lookups_are_answered_by_the_index_as_postgresql_answers_them(pg_serving_server: HeadraceProcess) -> None:
    server = pg_serving_server
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE pgidx_kv (k int PRIMARY KEY, v varchar(10), n bigint, price numeric(8,2))")
        conn.execute("INSERT INTO pgidx_kv VALUES (1, 'one', 10, 1.5), (2, 'two', NULL, 2), (3, NULL, 30, NULL)")
        wait_until_applied(conn, "pgidx_kv")
        conn.execute("CREATE INDEX pgidx_kv_k ON pgidx_kv (k)")
        before = answered_by_index(server)
        for k in (1, 2, 3, 4):
            for binary in (False, True):
                lookup_and_store(conn, k, binary=binary)
        assert lookup_and_store(conn, 1, binary=False) == [("one", 1, 10, Decimal("1.50"))]
        assert answered_by_index(server) >= before + 9  # every `k = %s` above; not the `k + 0` ones

        # simple protocol: each text a new statement of one shape, the literal's value looked up
        simple = conn.cursor()
        for k in (2, 3, 5):
            assert simple.execute(f"SELECT v, n FROM pgidx_kv WHERE k = {k}", prepare=False).fetchall() == \
                   conn.execute(f"SELECT v, n FROM pgidx_kv WHERE k + 0 = {k}").fetchall()

        # writes are seen at once
        conn.execute("INSERT INTO pgidx_kv VALUES (4, 'four', 40, 4.25)")
        assert lookup_and_store(conn, 4, binary=False) == [("four", 4, 40, Decimal("4.25"))]
        conn.execute("UPDATE pgidx_kv SET v = 'uno' WHERE k = 1")
        assert lookup_and_store(conn, 1, binary=True)[0][0] == "uno"
        conn.execute("DELETE FROM pgidx_kv WHERE k = 3")
        assert lookup_and_store(conn, 3, binary=False) == []

        # what the index declines, PostgreSQL answers: its own errors for values it refuses
        with pytest.raises(psycopg.errors.NumericValueOutOfRange):
            conn.execute("SELECT v FROM pgidx_kv WHERE k = '99999999999'")
        with pytest.raises(psycopg.errors.InvalidTextRepresentation):
            conn.execute("SELECT v FROM pgidx_kv WHERE k = 'abc'")
        # inside a transaction block PostgreSQL answers (its snapshot), with the same rows
        with conn.transaction():
            assert conn.execute("SELECT v FROM pgidx_kv WHERE k = %s", (4,)).fetchall() == [("four",)]


def test_a_role_without_select_is_refused_by_the_lookup_too(pg_serving_server: HeadraceProcess) -> None:
    server = pg_serving_server
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE pgidx_secret (k int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO pgidx_secret VALUES (1, 'hidden')")
        wait_until_applied(conn, "pgidx_secret")
        conn.execute("CREATE INDEX pgidx_secret_k ON pgidx_secret (k)")
        conn.execute("CREATE ROLE pgidx_reader LOGIN PASSWORD 'pw'")
        assert conn.execute("SELECT v FROM pgidx_secret WHERE k = %s", (1,)).fetchall() == [("hidden",)]
    dsn = server.dsn.replace("user=headrace", "user=pgidx_reader password=pw")
    with psycopg.connect(dsn, autocommit=True) as reader:
        for _ in range(2):  # the second time the statement's shape is known: still refused
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                reader.execute("SELECT v FROM pgidx_secret WHERE k = %s", (1,))
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                reader.execute("SELECT v FROM pgidx_secret WHERE k = 1", prepare=False)
