"""SUBSCRIBE on a server whose serving store is PostgreSQL (`--serving-store postgres`): the subscriber's SELECT
is PostgreSQL's (its functions, integer division, types in the RowDescription, errors with their SQLSTATEs) and
runs as an unprivileged reader, never as the store's admin (docs/store.md, "SUBSCRIBE and index arrangements on
PostgreSQL")."""

from __future__ import annotations

import json
from decimal import Decimal

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess, wait_for
from tests.e2e.webhook_client import post_webhook

pytestmark = pytest.mark.e2e


@pytest.fixture
def pg_server(pg_serving_server: HeadraceProcess) -> HeadraceProcess:
    return pg_serving_server


def _post(server: HeadraceProcess, body: dict[str, object]) -> None:
    response = post_webhook(server.webhook_url("pg_events"), json.dumps(body).encode(),
                            {"content-type": "application/json"})
    assert response.status_code == 200


def test_a_subscribers_select_is_postgresql_s(pg_server: HeadraceProcess) -> None:
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute("CREATE SOURCE pg_events FROM WEBHOOK BODY FORMAT JSON")
        _post(pg_server, {"kind": "a", "n": 7, "price": "2.50"})
        _post(pg_server, {"n": 9})
        wait_for(lambda: conn.execute("SELECT count(*) FROM pg_events").fetchone() == (2,), 120,
                 message="the source's rows")
        conn.execute("BEGIN")
        conn.execute("DECLARE c CURSOR FOR SUBSCRIBE (SELECT (body->>'n')::int / 2 AS half, "
                     "format('%s:%s', body->>'kind', body->'n') AS f, (body->>'price')::numeric(6,3) AS price, "
                     "interval '3 days 04:05:06' AS span FROM pg_events WHERE body ? 'kind')")
        cursor = conn.execute("FETCH ALL c WITH (timeout = '2s')")
        assert cursor.description is not None
        assert [(column.name, column.type_code) for column in cursor.description] == [
            ("hr_timestamp", 1700), ("hr_diff", 20), ("half", 23), ("f", 25), ("price", 1700), ("span", 1186)]
        assert [row[1:5] for row in cursor.fetchall()] == [(1, 3, "a:7", Decimal("2.500"))]
        conn.execute("COMMIT")
        _post(pg_server, {"kind": "b", "n": 1})
        seen = []
        with pytest.raises(psycopg.errors.QueryCanceled):  # a bare SUBSCRIBE, streamed, until cancelled
            for row in conn.cursor().stream("SUBSCRIBE (SELECT body->>'kind' AS kind FROM pg_events "
                                            "WHERE body ? 'kind')"):
                seen.append(row[2])
                if sorted(seen) == ["a", "b"]:
                    conn.cancel_safe()
        assert sorted(seen) == ["a", "b"]
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_postgresql_errors_and_the_reader_s_privileges(pg_server: HeadraceProcess) -> None:
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute("CREATE SOURCE IF NOT EXISTS pg_events FROM WEBHOOK BODY FORMAT JSON")
        with pytest.raises(psycopg.errors.UndefinedColumn, match='column "nosuch" does not exist'):
            conn.execute("SUBSCRIBE (SELECT nosuch FROM pg_events)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for function pg_read_file"):
            conn.execute("SUBSCRIBE (SELECT pg_read_file('/etc/hostname') AS f FROM pg_events)")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="query_to_xml"):
            conn.execute("SUBSCRIBE (SELECT query_to_xml('SELECT 1', true, true, '') AS x FROM pg_events)")
