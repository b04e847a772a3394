"""`headrace up --serving-store postgres`: sources' and views' rows live in the store PostgreSQL, as real relations,
and PostgreSQL answers the queries over them (docs/store.md), after headrace's own checks."""

from __future__ import annotations

import json

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess, wait_for
from tests.e2e.webhook_client import post_webhook


@pytest.fixture(scope="module")
def events(pg_serving_server: HeadraceProcess) -> HeadraceProcess:
    with psycopg.connect(pg_serving_server.dsn, autocommit=True) as conn:
        conn.execute("CREATE SOURCE events FROM WEBHOOK BODY FORMAT JSON")
        conn.execute("CREATE MATERIALIZED VIEW by_kind AS SELECT body->>'kind' AS kind, count(*) AS n, "
                     "sum((body->>'amount')::int) AS total FROM events GROUP BY body->>'kind'")
    for i in range(10):
        response = post_webhook(pg_serving_server.webhook_url("events"),
                                json.dumps({"kind": f"k{i % 3}", "amount": i}).encode(),
                                {"content-type": "application/json"})
        assert response.status_code == 200
    with psycopg.connect(pg_serving_server.dsn, autocommit=True) as conn:
        wait_for(lambda: conn.execute("SELECT sum(n) FROM by_kind").fetchone() == (10,), 120,
                 message="the view's rows")
    return pg_serving_server


def test_postgres_answers_over_views_and_sources(events: HeadraceProcess) -> None:
    with psycopg.connect(events.dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT kind, n, total, total / n, pg_typeof(total)::text FROM by_kind "
                            "ORDER BY kind").fetchall()
        assert rows == [("k0", 4, 18, 4, "bigint"), ("k1", 3, 12, 4, "bigint"), ("k2", 3, 15, 5, "bigint")]
        assert conn.execute("SELECT count(*), pg_typeof(body)::text, body #>> '{kind}' FROM events "
                            "WHERE (body->>'amount')::int = 4 GROUP BY 2, 3").fetchall() == [(1, "jsonb", "k1")]
        # a join across a view and a source, and a plain PostgreSQL view over them
        conn.execute("CREATE VIEW big AS SELECT o.body->>'kind' AS kind, p.total FROM events o "
                     "JOIN by_kind p ON p.kind = o.body->>'kind' WHERE (o.body->>'amount')::int > 7")
        assert conn.execute("SELECT * FROM big ORDER BY kind").fetchall() == [("k0", 18), ("k2", 15)]
        with pytest.raises(psycopg.errors.UndefinedColumn):  # PostgreSQL's own error
            conn.execute("SELECT nosuchcol FROM by_kind")


def test_catalog_is_postgres_own(events: HeadraceProcess) -> None:
    with psycopg.connect(events.dsn, autocommit=True) as conn:
        kinds = dict(conn.execute("SELECT relname, relkind::text FROM pg_class "
                                  "WHERE relnamespace = 'public'::regnamespace").fetchall())
        assert kinds["events"] == "r" and kinds["by_kind"] == "v"
        columns = conn.execute("SELECT column_name, data_type FROM information_schema.columns "
                               "WHERE table_name = 'by_kind' ORDER BY ordinal_position").fetchall()
        assert columns == [("kind", "text"), ("n", "bigint"), ("total", "bigint")]
        # the catalog's functions are PostgreSQL's too (over the real relations); the session's stay headrace's
        conn.execute("CREATE OR REPLACE VIEW small AS SELECT kind FROM by_kind WHERE n < 4")
        assert "by_kind.n < 4" in conn.execute("SELECT pg_get_viewdef('small', true)").fetchone()[0]
        assert conn.execute("SELECT to_regclass('by_kind')::text, has_table_privilege('by_kind', 'SELECT')"
                            ).fetchone() == ("by_kind", True)
        assert "headrace" in conn.execute("SELECT version()").fetchone()[0]
        # headrace's own system relations stay headrace's
        assert conn.execute("SELECT count(*) FROM headrace_internal.webhook_counters").fetchone() is not None


def test_privileges_hold_in_postgres_too(events: HeadraceProcess) -> None:
    with psycopg.connect(events.dsn, autocommit=True) as admin:
        admin.execute("CREATE ROLE reader LOGIN")
    dsn = events.dsn.replace("user=headrace", "user=reader")
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # headrace's check
            conn.execute("SELECT * FROM by_kind")
        # syntax headrace does not take (ORDER BY ... USING) goes to PostgreSQL unchecked by headrace: it refuses
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM by_kind ORDER BY kind USING <")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM headrace_internal.checkpoints ORDER BY fence USING <")
    with psycopg.connect(events.dsn, autocommit=True) as admin:
        admin.execute("GRANT SELECT ON by_kind TO reader")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT sum(n) FROM by_kind").fetchone() == (10,)
        assert len(conn.execute("SELECT * FROM by_kind ORDER BY kind USING <").fetchall()) == 3
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM events")
        with pytest.raises(psycopg.errors.WrongObjectType):  # writes go through headrace, which refuses them
            conn.execute("DELETE FROM by_kind")
    with psycopg.connect(events.dsn, autocommit=True) as admin:
        admin.execute("REVOKE SELECT ON by_kind FROM reader")
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM by_kind ORDER BY kind USING <")


def test_a_source_is_a_table_with_its_key_and_its_rows(events: HeadraceProcess) -> None:
    """A source's public relation is a PostgreSQL table its storage inherits (store/source_relation_postgres.py):
    catalog clients list it among tables, with its NOT NULL columns and (IDEMPOTENT) its key, and read its rows."""
    import sqlalchemy as sa

    with psycopg.connect(events.dsn, autocommit=True) as conn:
        conn.execute("CREATE SOURCE keyed FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id')")
        try:
            assert conn.execute("SELECT table_type FROM information_schema.tables WHERE table_schema = 'public' "
                                "AND table_name IN ('events', 'keyed') ORDER BY table_name"
                                ).fetchall() == [("BASE TABLE",), ("BASE TABLE",)]
            assert conn.execute("SELECT count(*) FROM events").fetchone() == (10,)  # the storage's rows, once
            assert conn.execute("SELECT count(*) FROM ONLY events").fetchone() == (0,)  # the parent holds none
            engine = sa.create_engine(f"postgresql+psycopg://headrace@127.0.0.1:{events.pg_port}/headrace",
                                      isolation_level="AUTOCOMMIT")
            try:
                inspector = sa.inspect(engine)
                assert {"events", "keyed"} <= set(inspector.get_table_names())
                assert "events" not in inspector.get_view_names()
                columns = {column["name"]: column for column in inspector.get_columns("keyed")}
                assert list(columns) == ["body", "received_at", "idempotency_key"]
                assert [columns[c]["nullable"] for c in columns] == [False, False, False]
                assert inspector.get_pk_constraint("keyed")["constrained_columns"] == ["idempotency_key"]
            finally:
                engine.dispose()
            with pytest.raises(psycopg.Error) as refused:  # sources are written by their webhooks only
                conn.execute("INSERT INTO keyed VALUES ('{}', now(), 'k')")
            assert refused.value.sqlstate in ("42809", "42501"), refused.value
        finally:
            conn.execute("DROP SOURCE keyed")
        assert conn.execute("SELECT to_regclass('public.keyed')").fetchone() == (None,)


def test_relations_are_their_creators_and_change_only_through_headrace(events: HeadraceProcess) -> None:
    """The store's relations are owned by their creators (psql's \\dt shows them), and the owner's changes headrace
    would not see are PostgreSQL's 42501: the store's event triggers refuse them (store/relation_guard_postgres.py)."""
    with psycopg.connect(events.dsn, autocommit=True) as conn:
        conn.execute("CREATE ROLE maker LOGIN CREATEDB")
        conn.execute("GRANT CREATE ON SCHEMA public TO maker")
        conn.execute("GRANT SELECT ON events TO maker")
    dsn = events.dsn.replace("user=headrace", "user=maker")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE made (id int PRIMARY KEY, note text)")
        conn.execute("CREATE MATERIALIZED VIEW made_counts AS SELECT note, count(*) AS n FROM made GROUP BY note")
        conn.execute("INSERT INTO made VALUES (1, 'a'), (2, 'a')")
        owners = dict(conn.execute("SELECT relname, pg_get_userbyid(relowner)::text FROM pg_class WHERE relname IN "
                                   "('made', 'made_counts', 'events')").fetchall())
        assert owners == {"made": "maker", "made_counts": "maker", "events": "headrace"}
        wait_for(lambda: conn.execute("SELECT n FROM made_counts").fetchall() == [(2,)], 60, message="the view")
        for statement in ("COMMENT ON TABLE made IS 'mine'",  # statements headrace passes to PostgreSQL as they are
                          "CREATE RULE quiet AS ON UPDATE TO made DO INSTEAD NOTHING",
                          "CREATE POLICY mine ON made USING (true)",
                          "ALTER TABLE made ENABLE ROW LEVEL SECURITY",
                          "COMMENT ON VIEW made_counts IS 'mine'"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
                conn.execute(statement)
            assert "through headrace" in str(refused.value) or "permission denied" in str(refused.value), statement
        # what the owner may do through headrace still works, and the view still reads as the owner
        conn.execute("UPDATE made SET note = 'b' WHERE id = 2")
        wait_for(lambda: sorted(conn.execute("SELECT note, n FROM made_counts").fetchall()) == [("a", 1), ("b", 1)],
                 60, message="the view after the update")
        conn.execute("DROP MATERIALIZED VIEW made_counts")
        conn.execute("DROP TABLE made")


def test_system_relations_join_with_everything_else_in_postgresql(events: HeadraceProcess) -> None:
    with psycopg.connect(events.dsn, autocommit=True) as conn:
        # headrace's in-memory counters, as of this statement, joined with PostgreSQL's catalog and a source's rows
        rows = conn.execute(
            "SELECT w.source, w.accepted, c.relkind::text, (SELECT count(*) FROM events) AS stored "
            "FROM headrace_internal.webhook_counters w JOIN pg_class c ON c.relname = w.source "
            "AND c.relnamespace = 'public'::regnamespace WHERE w.source = 'events'").fetchall()
        assert rows == [("events", 10, "r", 10)]
        post_webhook(events.webhook_url("events"), json.dumps({"kind": "k9", "amount": 1}).encode(),
                     {"content-type": "application/json"})
        cursor = conn.execute("SELECT accepted FROM headrace_internal.webhook_counters WHERE source = %s",
                              ["events"], prepare=True)  # the extended protocol, described by PostgreSQL
        assert cursor.fetchall() == [(11,)]  # refreshed for each statement that reads it
        assert [d.name for d in cursor.description] == ["accepted"]
        # the pipeline reports its sources every few seconds: the rows (the batch loop is quick) may come first
        wait_for(lambda: conn.execute("SELECT s.state, v.kind FROM headrace_internal.source_status s "
                                      "CROSS JOIN LATERAL (SELECT kind FROM by_kind ORDER BY kind LIMIT 1) v "
                                      "WHERE s.source = 'public.events'").fetchall() == [("running", "k0")],
                 30, message="events' status report")
        assert conn.execute("SELECT pg_typeof(last_batch_at)::text FROM headrace_internal.source_status "
                            "LIMIT 1").fetchone() == ("timestamp with time zone",)
