"""CancelRequest against a real server: psycopg's conn.cancel() stops a long-running SELECT with
57014, a CancelRequest with the wrong secret does nothing, and the connection stays usable. A client that goes
away mid-statement ends its statement on the store PostgreSQL too."""

from __future__ import annotations

import socket
import struct
import threading
import time

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess

pytestmark = pytest.mark.e2e

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


def test_a_client_that_goes_away_ends_its_statement(server: HeadraceProcess) -> None:
    assert server.store_url is not None
    marker = f"pg_sleep(59.{time.monotonic_ns() % 1000:03d})"  # this test's statement, told apart in pg_stat_activity
    client = psycopg.connect(server.dsn, autocommit=True)
    client.pgconn.send_query(f"SELECT {marker}".encode())  # sent, not waited for
    with psycopg.connect(server.store_url, autocommit=True) as store:
        def running() -> int:
            row = store.execute("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE %s",
                                (f"%{marker}%",)).fetchone()
            return int(row[0]) if row else 0
        deadline = time.monotonic() + 20
        while running() == 0:
            assert time.monotonic() < deadline, "the statement never started on the store"
            time.sleep(0.1)
        client.close()  # the client goes away mid-statement
        deadline = time.monotonic() + 10
        while running():
            assert time.monotonic() < deadline, "the statement ran on after its client went away"
            time.sleep(0.1)
