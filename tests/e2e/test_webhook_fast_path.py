"""The HTTP port's fast webhook path over raw sockets, against a real server: pipelined and
chunked requests on keep-alive connections, and connections handed to aiohttp mid-stream
(the SQL API after a webhook POST, a gzip body)."""

from __future__ import annotations

import gzip
import json
import re
import socket

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess, wait_for

pytestmark = pytest.mark.e2e


def post(name: str, body: bytes, *extra: str) -> bytes:
    headers = "".join(f"{line}\r\n" for line in extra)
    return (f"POST /api/webhook/headrace/public/{name} HTTP/1.1\r\nHost: t\r\n{headers}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def statuses(data: bytes) -> list[int]:
    return [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", data)]


def exchange(sock: socket.socket, data: bytes, responses: int, until: bytes = b"") -> bytes:
    sock.sendall(data)
    got = b""
    while len(statuses(got)) < responses or until not in got or not got.endswith((b"\r\n\r\n", b"}", b"]")):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def connect(server: HeadraceProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=20)
    return sock


def rows(server: HeadraceProcess, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def test_pipelined_chunked_keep_alive_and_hand_offs(server: HeadraceProcess) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE SOURCE fastpath FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id')")
    chunked = (b"POST /api/webhook/headrace/public/fastpath HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5\r\n{\"id\"\r\nc\r\n: \"chunked\"}\r\n0\r\n\r\n")
    with connect(server) as sock:
        # Pipelined: all in one write, answered in order (a 404 and a 400 in between).
        got = exchange(sock, post("fastpath", b'{"id": "p1"}') + post("missing", b"{}") + post("fastpath", b"{")
                       + chunked + post("fastpath", b'{"id": "p2"}'), 5)
        assert statuses(got) == [200, 404, 400, 200, 200]
        # Keep-alive: the same connection goes on, then is handed to aiohttp for the SQL API.
        assert statuses(exchange(sock, post("fastpath", b'{"id": "p3"}'), 1)) == [200]
        query = json.dumps({"query": "SELECT 1 AS one"}).encode()
        got = exchange(sock, b"POST /api/sql HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(query) + query, 1, until=b"results")
        assert statuses(got) == [200] and b'"one"' in got
        # aiohttp owns the connection now, and still takes webhooks on it.
        assert statuses(exchange(sock, post("fastpath", b'{"id": "p4"}'), 1)) == [200]
    with connect(server) as sock:
        compressed = gzip.compress(b'{"id": "gz"}')
        got = exchange(sock, post("fastpath", b'{"id": "p5"}') + post("fastpath", compressed, "Content-Encoding: gzip"), 2)
        assert statuses(got) == [200, 200]
    expected = [("chunked",), ("gz",), ("p1",), ("p2",), ("p3",), ("p4",), ("p5",)]
    seen: list[list[tuple[object, ...]]] = [[]]

    def visible() -> bool:
        seen[0] = rows(server, "SELECT body->>'id' FROM fastpath ORDER BY 1")
        return seen[0] == expected

    try:
        wait_for(visible, timeout=90, message="every accepted request visible once")
    except AssertionError:
        raise AssertionError(f"visible: {seen[0]}") from None
