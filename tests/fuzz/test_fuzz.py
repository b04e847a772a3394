"""The fuzz suite of issue 20: seeded hostile input on both ports of one real server, for a bounded time per fuzzer
(HEADRACE_FUZZ_SECONDS: 10 s in `make test`, minutes in `make fuzz`; HEADRACE_FUZZ_SEED replays a run).

Each fuzzer asserts what it sees (no XX000, no 5xx, no connection dropped where PostgreSQL keeps it) and then the
server's health: still up, RSS within RSS_GROWTH_BOUND_MB of where it started, the canary source and the view over
it complete (every acknowledged canary request exactly once) and nothing a client sent copied into the log."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess
from tests.fuzz.generators import http_request, message_sequence, sql_statement, startup_packet
from tests.fuzz.target import (INTERNAL_ERROR, FuzzTarget, read_backend, rss_mb, seconds_per_target,
                               seeded_random, startup_message)

pytestmark = pytest.mark.e2e

STATEMENT_TIMEOUT_S = 5.0  # a generated statement still running after this is cancelled (and counted)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzTarget]:
    server = HeadraceProcess(Path(tmp_path_factory.mktemp("fuzz")) / "data")
    server.start()
    fuzz_target = FuzzTarget(server)
    try:
        fuzz_target.set_up()
        yield fuzz_target
    finally:
        server.stop()


def _deadline() -> float:
    return time.monotonic() + seconds_per_target()


def test_sql_text(target: FuzzTarget) -> None:
    """Generated statements over the extended protocol (psycopg): every error has a SQLSTATE a client can act on
    (never XX000) and the session survives it."""
    rng, seed = seeded_random("sql")
    internal: list[tuple[str, str]] = []  # (message, statement)
    dropped: list[str] = []
    slow: list[str] = []
    statements = 0
    conn = psycopg.connect(target.server.dsn, autocommit=True)
    deadline = _deadline()
    try:
        while time.monotonic() < deadline:
            statement = sql_statement(rng)
            statements += 1
            canceller = threading.Timer(STATEMENT_TIMEOUT_S, conn.cancel)
            canceller.start()
            try:
                if "COPY" in statement.upper():  # a COPY must be read through psycopg's copy, or the session waits
                    with conn.cursor().copy(statement) as copy:
                        for _ in copy:
                            pass
                elif _returns_rows(statement):
                    conn.execute(statement, prepare=False).fetchall()
                else:
                    conn.execute(statement, prepare=False)
            except psycopg.Error as error:
                if conn.broken or conn.closed:  # not the class: psycopg maps SQLSTATE classes 53-58 to it too
                    dropped.append(f"{statement[:200]!r}: {error}")
                    conn = psycopg.connect(target.server.dsn, autocommit=True)
                elif error.sqlstate == INTERNAL_ERROR:
                    internal.append((str(error)[:120], statement[:300]))
                elif error.sqlstate == "57014":
                    slow.append(statement[:200])
            finally:
                canceller.cancel()
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
    finally:
        conn.close()
    assert not internal, f"seed {seed}: {len(internal)} of {statements} statements gave XX000:\n" + \
        _by_message(internal)
    assert not dropped, f"seed {seed}: the server dropped the session on:\n" + "\n".join(dropped[:20])
    assert len(slow) <= max(1, statements // 100), f"seed {seed}: {len(slow)} statements ran over " \
        f"{STATEMENT_TIMEOUT_S} s:\n" + "\n".join(slow[:20])
    target.assert_healthy()


def _by_message(findings: list[tuple[str, str]]) -> str:
    """One line per distinct message: how often, and the shortest input that gave it."""
    examples: dict[str, list[str]] = {}
    for message, example in findings:
        examples.setdefault(message, []).append(example)
    return "\n".join(f"{len(inputs)} x {message}\n    e.g. {min(inputs, key=len)!r}"
                     for message, inputs in sorted(examples.items(), key=lambda item: -len(item[1])))


def _returns_rows(statement: str) -> bool:
    head = statement.lstrip().split(" ", 1)[0].upper()
    return head in ("SELECT", "WITH", "SHOW", "EXPLAIN", "FETCH", "VALUES", "TABLE")


def test_pgwire_messages(target: FuzzTarget) -> None:
    """Startup packets and message sequences, well-framed or not, on raw sockets: the server answers each with
    messages of valid framing, never an XX000 error, and closes only what PostgreSQL would close."""
    rng, seed = seeded_random("pgwire")
    internal: list[tuple[str, str]] = []
    connections = 0
    deadline = _deadline()
    while time.monotonic() < deadline:
        connections += 1
        with socket.create_connection(("127.0.0.1", target.server.pg_port), timeout=5) as sock:
            if rng.random() < 0.3:
                packet = startup_packet(rng, "headrace")
                _send(sock, packet)
                errors, _ = read_backend(sock, until_ready=True, timeout=1.0)
            else:
                _send(sock, startup_message("headrace"))
                errors, closed = read_backend(sock, until_ready=True, timeout=5.0)
                assert not closed and not errors, f"seed {seed}: a valid startup was refused: {errors}"
                for _ in range(rng.randint(1, 5)):
                    _send(sock, message_sequence(rng))
                    more, closed = read_backend(sock, until_ready=True, timeout=STATEMENT_TIMEOUT_S)
                    errors += more
                    if closed:
                        break
        internal += [(fields.get("M", "")[:120], "connection") for kind, fields in errors
                     if kind == "E" and fields.get("C") == INTERNAL_ERROR]
    assert not internal, f"seed {seed}: {len(internal)} XX000 errors over {connections} connections:\n" + \
        _by_message(internal)
    target.assert_healthy()


def _send(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may close a connection mid-send on a protocol violation


def test_webhook_http(target: FuzzTarget) -> None:
    """Raw HTTP requests to the webhook port (broken heads, framing, encodings, bodies): never a 5xx but 503
    (which senders retry), never a connection left hanging without an answer to a complete request."""
    rng, seed = seeded_random("http")
    server_errors: list[str] = []
    requests = 0
    deadline = _deadline()
    while time.monotonic() < deadline:
        requests += 1
        request = http_request(rng, target.server.http_port, ("canary", "fz_text"))
        with socket.create_connection(("127.0.0.1", target.server.http_port), timeout=5) as sock:
            _send(sock, request)
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            status = _status_of(_read_all(sock, timeout=5.0))
        if status is not None and status >= 500 and status != 503:
            server_errors.append(f"{status} for {request[:300]!r}")
    assert not server_errors, f"seed {seed}: {len(server_errors)} of {requests} requests got a 5xx:\n" + \
        "\n".join(server_errors[:20])
    target.assert_healthy()


def _read_all(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    data = bytearray()
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (socket.timeout, TimeoutError, ConnectionResetError):
        pass
    return bytes(data)


def _status_of(response: bytes) -> int | None:
    if not response.startswith(b"HTTP/1."):
        return None
    try:
        return int(response[9:12])
    except ValueError:
        return None


def test_pgwire_length_claims(target: FuzzTarget) -> None:
    """Messages that claim more bytes than they bring, before and after authentication: the server neither waits
    for nor reserves what was only claimed."""
    rss_before = rss_mb(target.pid)
    sockets: list[socket.socket] = []
    try:
        for index in range(50):
            sock = socket.create_connection(("127.0.0.1", target.server.pg_port), timeout=5)
            sockets.append(sock)
            if index % 2:
                _send(sock, struct.pack("!I", (1 << 30) - 1) + struct.pack("!I", 196608) + b"user\0")
            else:
                _send(sock, startup_message("headrace"))
                read_backend(sock, until_ready=True, timeout=5.0)
                _send(sock, b"Q" + struct.pack("!I", (1 << 30) - 1) + b"SELECT " + b"1" * 65536)
        time.sleep(1.0)
        growth = rss_mb(target.pid) - rss_before
        assert growth < 100, f"claimed lengths grew the server by {growth:.0f} MB"
    finally:
        for sock in sockets:
            sock.close()
    target.assert_healthy()
