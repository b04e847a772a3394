"""SUBSCRIBE against a real server: a cursor over a source's changes sees the snapshot, then each
committed change; a bare SUBSCRIBE streams rows until cancelled, the client leaves, or UP TO."""

from __future__ import annotations

import json
import urllib.request

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess, wait_for

pytestmark = pytest.mark.e2e


def _post(server: HeadraceProcess, source: str, body: dict[str, object]) -> int:
    request = urllib.request.Request(server.webhook_url(source), data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


def _count(conn: psycopg.Connection, source: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM {source}").fetchone()
    assert row is not None
    return int(row[0])


def test_cursor_over_subscribe_sees_snapshot_then_changes(server: HeadraceProcess) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE SOURCE sub_events FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id')")
        assert _post(server, "sub_events", {"id": "a", "n": 1}) == 200
        wait_for(lambda: _count(conn, "sub_events") == 1, timeout=60, message="first row visible")

        conn.execute("BEGIN")
        conn.execute("DECLARE c CURSOR FOR SUBSCRIBE (SELECT body->>'id' AS id FROM sub_events)")
        snapshot = conn.execute("FETCH ALL c WITH (timeout = '2s')").fetchall()
        assert [(row[1], row[2]) for row in snapshot] == [(1, "a")]  # hr_diff, id

        assert _post(server, "sub_events", {"id": "b", "n": 2}) == 200
        change = conn.execute("FETCH 1 c").fetchall()  # no timeout: waits for the next change
        assert [(row[1], row[2]) for row in change] == [(1, "b")]
        assert change[0][0] > snapshot[0][0]  # hr_timestamp advances

        assert conn.execute("FETCH ALL c WITH (timeout = '200ms')").fetchall() == []
        conn.execute("COMMIT")


def test_bare_subscribe_streams_until_cancelled_extended_protocol(server: HeadraceProcess) -> None:
    """psycopg's stream() (extended protocol, rows as they arrive): snapshot, then a change posted while
    iterating, then a cancel ends it with 57014 and the connection stays usable."""
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE SOURCE sub_bare FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id')")
        assert _post(server, "sub_bare", {"id": "a"}) == 200
        wait_for(lambda: _count(conn, "sub_bare") == 1, timeout=60, message="first row visible")
        rows = []
        with pytest.raises(psycopg.errors.QueryCanceled):
            for row in conn.cursor().stream("SUBSCRIBE (SELECT body->>'id' AS id FROM sub_bare)"):
                rows.append(row)
                if len(rows) == 1:
                    assert _post(server, "sub_bare", {"id": "b"}) == 200  # arrives while we iterate
                else:
                    conn.cancel_safe()
        assert [(row[1], row[2]) for row in rows] == [(1, "a"), (1, "b")]
        assert rows[1][0] > rows[0][0]
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the session is still usable


def test_bare_subscribe_simple_protocol_streams_and_ends_at_up_to(server: HeadraceProcess) -> None:
    """The simple protocol (libpq PQsendQuery in single-row mode, as psql's FETCH_COUNT does): the snapshot
    row arrives before the statement ends; a SUBSCRIBE with UP TO completes with its tag."""
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE SOURCE sub_simple FROM WEBHOOK BODY FORMAT JSON")
        assert _post(server, "sub_simple", {"n": 1}) == 200
        wait_for(lambda: _count(conn, "sub_simple") == 1, timeout=60, message="row visible")
        pgconn = conn.pgconn
        pgconn.send_query(b"SUBSCRIBE sub_simple")
        pgconn.set_single_row_mode()
        while pgconn.is_busy():
            pgconn.consume_input()
        first = pgconn.get_result()
        assert first is not None and first.status == psycopg.pq.ExecStatus.SINGLE_TUPLE
        assert json.loads(first.get_value(0, 2)) == {"n": 1}  # hr_timestamp, hr_diff, body
        pgconn.request_cancel() if hasattr(pgconn, "request_cancel") else pgconn.get_cancel().cancel()
        statuses = []
        while (result := pgconn.get_result()) is not None:
            statuses.append((result.status, result.error_field(psycopg.pq.DiagnosticField.SQLSTATE)))
        assert statuses[-1] == (psycopg.pq.ExecStatus.FATAL_ERROR, b"57014")
        at = int(first.get_value(0, 0))
        cursor = conn.execute(f"SUBSCRIBE sub_simple AS OF {at} UP TO {at + 1}")  # the snapshot, then done
        assert [row[2] for row in cursor.fetchall()] == [{"n": 1}]
        assert cursor.statusmessage == "SUBSCRIBE 1"


def test_bare_subscribe_ends_when_the_client_goes_away(server: HeadraceProcess) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE SOURCE sub_gone FROM WEBHOOK BODY FORMAT JSON")
    leaving = psycopg.connect(server.dsn, autocommit=True)
    leaving.pgconn.send_query(b"SUBSCRIBE sub_gone")
    leaving.close()  # closes the socket mid-stream
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
