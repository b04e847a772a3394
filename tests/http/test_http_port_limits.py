"""The HTTP port under hostile clients, driven from outside its process with raw sockets: chunked
bodies cost linear CPU, slow clients are timed out, a refused body is drained so its sender reads
the answer, the concurrency limit counts bodies still being read, and a malformed head is logged
in one line without its bytes."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp.http_exceptions
import pytest

from headrace.http.error_log import RequestErrorLogger
from tests.http.http_server import HttpServerProcess, wait_until

EVENTS = b"/api/webhook/headrace/public/events"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[HttpServerProcess]:
    process = HttpServerProcess(tmp_path / "data", ["--header-timeout-s", "1", "--body-timeout-s", "1",
                                                    "--keepalive-timeout-s", "1.5", "--max-concurrent", "2"])
    yield process
    process.stop()


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """(status, everything read until the server closed or 2 s of silence after a full head)."""
    data = b""
    sock.settimeout(10)
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        data += chunk
        if b"\r\n\r\n" in data:
            sock.settimeout(0.5)
    assert data.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), data[:200]
    return int(data.split(b" ", 2)[1]), data


def post_head(length: int | None = None, path: bytes = EVENTS) -> bytes:
    framing = b"Transfer-Encoding: chunked" if length is None else b"Content-Length: %d" % length
    return b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n" + framing + b"\r\n\r\n"


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def test_800_kb_in_1_byte_chunks_costs_under_a_second_of_server_cpu(server: HttpServerProcess) -> None:
    body = b"".join(b"1\r\n%c\r\n" % (97 + i % 26) for i in range(800_000)) + b"0\r\n\r\n"
    with server.connect() as sock:
        before = server.cpu_seconds()
        sock.sendall(post_head())
        for offset in range(0, len(body), 8192):  # many reads: a decoder that restarts per read is quadratic
            sock.sendall(body[offset:offset + 8192])
        status, _ = read_response(sock)
        cpu = server.cpu_seconds() - before
    assert status == 200
    assert cpu < 1.0, f"{cpu:.2f} s of server CPU"


def test_a_slow_head_a_stalled_body_and_an_idle_connection_are_closed(server: HttpServerProcess) -> None:
    with server.connect() as slowloris, server.connect() as stalled, server.connect() as idle, \
            server.connect() as stalled_gzip:
        slowloris.sendall(b"POST /api/webhook/headrace/public/events HTTP/1.1\r\nHost: x\r\n")
        stalled.sendall(post_head(100) + b"only part of it")
        # Content-Encoding: the request goes to aiohttp, which reads the body with the same timeout.
        stalled_gzip.sendall(post_head(100).replace(b"\r\n\r\n", b"\r\nContent-Encoding: gzip\r\n\r\n") + b"\x1f")
        started = time.monotonic()
        for _ in range(3):  # a byte now and then does not keep a head alive
            time.sleep(0.3)
            slowloris.sendall(b"X-Slow: 1\r\n")
        assert read_response(slowloris)[0] == 408
        assert read_response(stalled)[0] == 408
        assert read_response(stalled_gzip)[0] == 408
        assert closed_by_server(idle, 5)
        assert time.monotonic() - started < 6
    with server.connect() as sock:  # the port still serves
        sock.sendall(post_head(5) + b"hello")
        assert read_response(sock)[0] == 200


def test_a_plain_sender_over_the_limit_reads_413_not_a_reset(server: HttpServerProcess) -> None:
    body = b"x" * (12 << 20)  # over the 5 MiB default, sent whole without Expect: 100-continue
    for head, payload in ((post_head(len(body)), body),
                          (post_head(), b"".join(b"10000\r\n" + body[i:i + 65536] + b"\r\n"
                                                 for i in range(0, len(body), 65536)) + b"0\r\n\r\n")):
        with server.connect() as sock:
            failures: list[OSError] = []

            def send() -> None:
                try:
                    sock.sendall(head + payload)
                except OSError as error:  # a reset: what a client like requests reports instead of the 413
                    failures.append(error)

            sender = threading.Thread(target=send)
            sender.start()
            sender.join(20)
            assert not sender.is_alive() and failures == []  # the server drained the body
            status, response = read_response(sock)
            assert status == 413 and b"exceeds" in response


def test_the_concurrency_limit_counts_bodies_still_being_read(server: HttpServerProcess) -> None:
    with server.connect() as first, server.connect() as second, server.connect() as third:
        first.sendall(post_head(1000) + b"a")  # two bodies stall half-read: the limit (2) is reached
        second.sendall(post_head(1000) + b"b")
        time.sleep(0.2)
        third.sendall(post_head(5) + b"hello")
        status, response = read_response(third)
        assert status == 429 and b"Retry-After: 1" in response
        first.sendall(b"a" * 999)
        assert read_response(first)[0] == 200
    with server.connect() as sock:
        sock.sendall(post_head(5) + b"hello")
        assert read_response(sock)[0] == 200


def test_full_size_bodies_one_after_another_on_one_connection(server: HttpServerProcess) -> None:
    """A body of the whole limit stops the connection's reading until it is durable; then it resumes."""
    body = b"y" * (5 << 20)
    with server.connect() as sock:
        for _ in range(3):
            sock.sendall(post_head(len(body)) + body)
            sock.settimeout(30)
            response = sock.recv(65536)
            assert response.startswith(b"HTTP/1.1 200 "), response[:100]


def test_a_malformed_head_is_logged_in_one_line_without_its_bytes(server: HttpServerProcess) -> None:
    secrets = [b"SECRET-ONE", b"SECRET-TWO", b"SECRET-3"]
    for request in (b"GET / HTTP/1.1\r\nHost: x\r\nBad Header " + secrets[0] + b"\r\n\r\n",
                    b"POST /api/sql HTTP/1.1\r\nContent-Length: 1" + secrets[1] + b"\r\n\r\n",
                    b"GET /x HTTP/1.1\r\nHost: \x01" + secrets[2] + b"\r\n\r\n"):
        with server.connect() as sock:
            sock.sendall(request)
            assert read_response(sock)[0] == 400
    assert wait_until(lambda: server.log().count("malformed HTTP request") == 3, 5), server.log()
    log = server.log()
    assert "Traceback" not in log and not any(secret.decode() in log for secret in secrets)
    assert len(log.strip().splitlines()) == 3


def test_the_request_error_logger_keeps_one_line_and_no_bytes(caplog: pytest.LogCaptureFixture) -> None:
    logger = RequestErrorLogger()
    error = aiohttp.http_exceptions.BadHttpMessage("Invalid header token:\n\n  b'Bad Header SECRET'")
    with caplog.at_level(logging.DEBUG, logger="headrace.http"):
        logger.exception("Error handling request from %s", "127.0.0.1", exc_info=error)
        try:
            raise KeyError("a bug of ours")
        except KeyError as bug:
            logger.exception("Unhandled exception", exc_info=bug)
    parse_error, bug_record = caplog.records
    assert parse_error.getMessage() == "malformed HTTP request from 127.0.0.1 refused with 400 (BadHttpMessage)"
    assert parse_error.levelno == logging.WARNING and parse_error.exc_info is None
    assert bug_record.levelno == logging.ERROR and bug_record.exc_info is not None  # our bugs keep their traceback
