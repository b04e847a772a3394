"""SUBSCRIBE against a real server: a cursor over a source's changes sees the snapshot, then each
committed change; a bare SUBSCRIBE is refused with a message naming the forms that work."""

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


def test_bare_subscribe_is_refused_with_the_forms_that_work(server: HeadraceProcess) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE SOURCE sub_bare FROM WEBHOOK BODY FORMAT JSON")
        with pytest.raises(psycopg.errors.FeatureNotSupported) as error:
            conn.execute("SUBSCRIBE sub_bare")
        assert "DECLARE" in (error.value.diag.message_hint or "")
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the session is still usable
