"""SUBSCRIBE through the clients of issue 3's Done-when: psycopg 3 cancelling a FETCH that blocks on a SUBSCRIBE
cursor (no timeout: it waits for a change that never comes), and psql running `COPY (SUBSCRIBE ...) TO STDOUT`
(the snapshot and a later change, ended by UP TO)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.request

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess, wait_for

pytestmark = pytest.mark.e2e


def post(server: HeadraceProcess, source: str, body: dict[str, object]) -> int:
    request = urllib.request.Request(server.webhook_url(source), data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)


def count(conn: psycopg.Connection, source: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM {source}").fetchone()
    assert row is not None
    return int(row[0])


def test_psycopg_cancels_a_blocking_fetch_on_a_subscribe_cursor(server: HeadraceProcess) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE SOURCE sub_cancel FROM WEBHOOK BODY FORMAT JSON")
        assert post(server, "sub_cancel", {"n": 1}) == 200
        wait_for(lambda: count(conn, "sub_cancel") == 1, timeout=150, message="row visible")

        conn.execute("BEGIN")
        conn.execute("DECLARE c CURSOR FOR SUBSCRIBE sub_cancel")
        assert len(conn.execute("FETCH ALL c WITH (timeout = '2s')").fetchall()) == 1  # the snapshot
        timer = threading.Timer(1.0, conn.cancel)
        timer.start()
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled) as cancelled:
            conn.execute("FETCH 1 c")  # no timeout: blocks until a change, or the cancel
        timer.join()
        assert cancelled.value.sqlstate == "57014"
        assert "canceling statement due to user request" in str(cancelled.value)
        assert 0.9 <= time.monotonic() - started < 10  # it really blocked, and the cancel really ended it
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        conn.execute("ROLLBACK")
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the connection goes on
        conn.execute("DROP SOURCE sub_cancel")


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed (scripts/bootstrap.sh)")
def test_psql_copy_subscribe_to_stdout(server: HeadraceProcess) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE SOURCE sub_psql FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id')")
        assert post(server, "sub_psql", {"id": "a"}) == 200
        wait_for(lambda: count(conn, "sub_psql") == 1, timeout=150, message="first row visible")
        with conn.transaction():
            conn.execute("DECLARE c CURSOR FOR SUBSCRIBE (SELECT body->>'id' AS id FROM sub_psql)")
            [(first_at, _, _)] = conn.execute("FETCH ALL c WITH (timeout = '2s')").fetchall()
            assert post(server, "sub_psql", {"id": "b"}) == 200
            [(change_at, _, _)] = conn.execute("FETCH 1 c").fetchall()

    query = f"COPY (SUBSCRIBE (SELECT body->>'id' AS id FROM sub_psql) AS OF {first_at} UP TO {change_at + 1}) TO STDOUT"
    result = subprocess.run(["psql", "-X", "-h", "127.0.0.1", "-p", str(server.pg_port), "-U", "headrace", "headrace",
                             "-v", "ON_ERROR_STOP=1", "-c", query], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"{first_at}\t1\ta", f"{change_at}\t1\tb"]

    csv = subprocess.run(["psql", "-X", "-h", "127.0.0.1", "-p", str(server.pg_port), "-U", "headrace", "headrace",
                          "-c", query.replace("TO STDOUT", "TO STDOUT WITH (FORMAT csv, HEADER)")],
                         capture_output=True, text=True, timeout=60)
    assert csv.returncode == 0, csv.stderr
    assert csv.stdout.splitlines()[0] == "hr_timestamp,hr_diff,id"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("DROP SOURCE sub_psql")
