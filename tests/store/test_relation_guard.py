"""store/relation_guard_postgres.py against a real PostgreSQL 15: a managed relation owned by a (non-superuser) role
cannot be changed by it behind headrace's back, while the admin (a superuser) still can, and the role's other
objects stay its own to change."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from types import SimpleNamespace

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from headrace.store import relation_guard_postgres
from headrace.store.postgres_serving import ConnectionPool, PostgresServingStore

from ..real_servers.postgres import shared_cluster


@pytest.fixture
def store() -> Iterator[PostgresServingStore]:
    conninfo = shared_cluster().create_database(f"guard_{uuid.uuid4().hex[:8]}")
    serving = PostgresServingStore(conninfo)
    yield serving
    serving.close()


def test_the_owner_cannot_change_a_managed_relation_behind_headrace(store: PostgresServingStore) -> None:
    assert relation_guard_postgres.install(store)
    assert relation_guard_postgres.install(store)  # idempotent: every start installs it
    owner = f"owner_{uuid.uuid4().hex[:6]}"
    store.execute(f"CREATE ROLE {owner} LOGIN", f"GRANT CREATE ON SCHEMA public TO {owner}",
                  "CREATE TABLE headrace_internal.storage_t (id int, note text)",
                  "CREATE TABLE public.kept (id int PRIMARY KEY, note text)",
                  "CREATE VIEW public.shown AS SELECT id, note FROM headrace_internal.storage_t")
    for relation in ("public.kept", "public.shown"):
        with store.pool.connection() as conn:
            statements = relation_guard_postgres.give_to_owner(conn, relation, owner)
            conn.rollback()
        store.execute(*statements, f"GRANT SELECT ON {relation} TO {owner}")  # the guard records the ACL
    assert store.execute("SELECT pg_get_userbyid(relowner)::text FROM pg_class WHERE oid = 'public.kept'::regclass"
                         ) == [(owner,)]
    as_owner = make_conninfo(**{**conninfo_to_dict(store.conninfo), "user": owner})
    with psycopg.connect(as_owner, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM shown").fetchone() == (0,)  # the view reads as its owner
        for statement in ("ALTER TABLE kept ADD COLUMN extra int", "COMMENT ON TABLE kept IS 'mine'",
                          "CREATE RULE quiet AS ON UPDATE TO kept DO INSTEAD NOTHING",
                          "CREATE POLICY mine ON kept USING (true)", "CREATE INDEX kept_note ON kept (note)",
                          "GRANT SELECT ON kept TO PUBLIC", f"GRANT INSERT ON kept TO {owner}",
                          "CREATE OR REPLACE VIEW shown AS SELECT id, note, 1 AS extra FROM headrace_internal.storage_t",
                          "ALTER VIEW shown RENAME TO elsewhere", "DROP VIEW shown", "DROP TABLE kept"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="through headrace"):
                conn.execute(statement)
        for statement in ("INSERT INTO kept VALUES (1, 'x')", "TRUNCATE kept", "DELETE FROM kept"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):  # owner privileges beyond SELECT revoked
                conn.execute(statement)
        # the role's own relations are its own
        conn.execute("CREATE TABLE mine (x int)")
        conn.execute("GRANT SELECT ON mine TO PUBLIC")
        conn.execute("COMMENT ON TABLE mine IS 'mine'")
        conn.execute("DROP TABLE mine")
    # headrace's admin (a superuser) changes them, and its GRANTs are recorded as the ACL to keep
    store.execute("COMMENT ON TABLE public.kept IS 'kept by headrace'", "GRANT SELECT ON public.kept TO PUBLIC")
    with psycopg.connect(as_owner, autocommit=True) as conn:
        conn.execute("CREATE TABLE mine (x int)")
        conn.execute("GRANT SELECT ON mine TO PUBLIC")  # no managed relation's ACL differs from the recorded one
    store.execute("DROP VIEW public.shown", "DROP TABLE public.kept")
    assert store.execute(f"SELECT count(*) FROM {relation_guard_postgres.MANAGED_TABLE}") == [(0,)]


def test_without_a_superuser_admin_nothing_is_installed(store: PostgresServingStore) -> None:
    admin = f"admin_{uuid.uuid4().hex[:6]}"
    store.execute(f"CREATE ROLE {admin} LOGIN CREATEROLE")
    pool = ConnectionPool(make_conninfo(**{**conninfo_to_dict(store.conninfo), "user": admin}))
    try:
        assert not relation_guard_postgres.install(SimpleNamespace(pool=pool))  # type: ignore[arg-type]
    finally:
        pool.close()
    assert store.execute("SELECT count(*) FROM pg_event_trigger") == [(0,)]
