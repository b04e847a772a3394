"""CancelRequest against a real server: psycopg's conn.cancel() stops a long-running SELECT with
57014, a CancelRequest with the wrong secret does nothing, and the connection stays usable."""

from __future__ import annotations

import socket
import struct
import threading
import time

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess

pytestmark = pytest.mark.e2e

# A cross join DuckDB needs many seconds for; cancelled long before it ends.
LONG_QUERY = "SELECT pg_sleep(60)"  # the store PostgreSQL runs it: the cancel must reach it


def send_cancel_request(port: int, process_id: int, secret_key: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(struct.pack("!iiii", 16, 80877102, process_id, secret_key))
        assert sock.recv(1) == b""  # the server closes without answering, as PostgreSQL does


def test_cancel_a_long_query(server: HeadraceProcess) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        pid = conn.info.backend_pid
        outcome: list[BaseException | None] = []

        def run() -> None:
            try:
                conn.execute(LONG_QUERY)
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                outcome.append(exc)

        started = time.monotonic()
        runner = threading.Thread(target=run)
        runner.start()
        time.sleep(1.0)
        send_cancel_request(server.pg_port, pid, 12345)  # a wrong secret: ignored
        time.sleep(0.5)
        assert runner.is_alive(), "the wrong secret must not cancel"
        conn.cancel()
        runner.join(30)
        assert not runner.is_alive()
        assert isinstance(outcome[0], psycopg.errors.QueryCanceled), outcome
        assert str(outcome[0]).startswith("canceling statement due to user request")
        assert outcome[0].sqlstate == "57014"
        assert time.monotonic() - started < 20
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the session goes on
