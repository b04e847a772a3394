"""A large result read slowly keeps the server's memory bounded (issue 20): the rows stay in the store and come out
as the client takes them, on either serving store, over the simple and the extended protocol; a client that goes
away mid-result ends the query and leaves the server serving."""

from __future__ import annotations

import socket
import struct
import time

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess
from tests.e2e.test_limits import rss_kib, startup_packet

pytestmark = pytest.mark.e2e

ROWS = 50_000_000
QUERY = f"SELECT i, i * 2 AS twice FROM generate_series(1, {ROWS}) AS g(i)"
RSS_GROWTH_BOUND_KIB = 150 * 1024
RSS_BOUND_KIB = 500 * 1024  # the bound for the whole server process


@pytest.fixture(params=["duckdb", "postgres"])
def serving(request: pytest.FixtureRequest) -> HeadraceProcess:
    return request.getfixturevalue("server" if request.param == "duckdb" else "pg_serving_server")


def read_until_ready(sock: socket.socket) -> None:
    received = b""
    while not received.endswith(b"Z\x00\x00\x00\x05I"):
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        received += chunk


def simple_query(sql: str) -> bytes:
    body = sql.encode() + b"\0"
    return b"Q" + struct.pack("!i", len(body) + 4) + body


def extended_query(sql: str) -> bytes:
    """Parse, Bind (text results), Execute with no row limit, Sync: psycopg's and JDBC's way."""
    def message(kind: bytes, body: bytes) -> bytes:
        return kind + struct.pack("!i", len(body) + 4) + body
    return (message(b"P", b"\0" + sql.encode() + b"\0" + struct.pack("!h", 0))
            + message(b"B", b"\0\0" + struct.pack("!hhh", 0, 0, 0))
            + message(b"E", b"\0" + struct.pack("!i", 0)) + message(b"S", b""))


@pytest.mark.parametrize("protocol", [simple_query, extended_query], ids=["simple", "extended"])
def test_a_50_million_row_select_read_slowly_keeps_server_memory_bounded(serving: HeadraceProcess,
                                                                         protocol: object) -> None:
    assert serving.process is not None
    pid = serving.process.pid
    with psycopg.connect(serving.dsn, autocommit=True) as warm:  # the server's own start-up growth is not counted
        warm.execute("SELECT i FROM generate_series(1, 100000) AS g(i)").fetchall()
    before = rss_kib(pid)
    peak = before
    received = 0
    with socket.create_connection(("127.0.0.1", serving.pg_port), timeout=30) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.sendall(startup_packet("headrace"))
        read_until_ready(sock)
        sock.sendall(protocol(QUERY))  # type: ignore[operator]
        first = sock.recv(65536)
        assert first[:1] in (b"T", b"1"), first[:200]  # RowDescription (simple) or ParseComplete (extended)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # ~1.3 MB/s: far slower than the store produces rows
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection mid-result"
            assert b"E\x00" not in chunk[:2], chunk[:200]
            received += len(chunk)
            peak = max(peak, rss_kib(pid))
            time.sleep(0.05)
    assert received > 1_000_000, f"only {received} bytes of rows arrived"
    print(f"server RSS {before // 1024} MB before, {peak // 1024} MB at most while {received} bytes were read")
    assert peak - before < RSS_GROWTH_BOUND_KIB, f"server RSS grew {(peak - before) // 1024} MB reading rows slowly"
    assert peak < RSS_BOUND_KIB, f"server RSS reached {peak // 1024} MB"
    # The client went away mid-result: the query ends, the server goes on serving (and its memory comes back).
    with psycopg.connect(serving.dsn, autocommit=True, connect_timeout=10) as conn:
        started = time.monotonic()
        assert conn.execute("SELECT count(*) FROM generate_series(1, 1000) AS g(i)").fetchone() == (1000,)
        assert time.monotonic() - started < 10
    assert rss_kib(pid) - before < RSS_GROWTH_BOUND_KIB


def test_every_row_of_a_streamed_result_arrives_once_with_postgresqls_tag(serving: HeadraceProcess) -> None:
    """Pieces joined: every row in order, and CommandComplete counts them all (SELECT n), on both protocols."""
    count = 3 * 8192 + 17  # several pieces of coordinator/row_streams.py's size and a short last one
    sql = f"SELECT i FROM generate_series(1, {count}) AS g(i) ORDER BY i"
    with psycopg.connect(serving.dsn, autocommit=True) as conn:
        cursor = conn.execute(sql)
        assert [row[0] for row in cursor.fetchall()] == list(range(1, count + 1))
        assert cursor.statusmessage == f"SELECT {count}"
        cursor = conn.execute(sql, prepare=True)
        assert cursor.rowcount == count
        with conn.cursor() as raw:  # the simple protocol (no parameters, psycopg's execute with ClientCursor)
            raw.execute(psycopg.sql.SQL(sql))
            assert raw.rowcount == count


def test_an_error_after_the_first_pieces_is_reported_after_their_rows(serving: HeadraceProcess) -> None:
    with psycopg.connect(serving.dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 10 / (30000 - i) FROM generate_series(1, 40000) AS g(i)").fetchall()
        assert conn.execute("SELECT 1").fetchone() == (1,)
