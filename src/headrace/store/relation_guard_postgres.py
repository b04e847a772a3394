"""Relations owned by their creators, changed only through headrace (the PostgreSQL serving store; blocking).

A user who creates a source, table or materialized view owns it in headrace, and psql's `\\dt`, `\\dv`, `\\dp`,
DBeaver and SQLAlchemy should say so: the store's relation is made the creator's (ALTER ... OWNER TO, see
coordinator/store_grants.py). But PostgreSQL lets an owner change a relation in ways headrace must see first: ALTER
it, COMMENT on it, put a rule, trigger, policy or index on it, GRANT on it, DROP it. headrace parses the statements
it knows and runs them itself; one it cannot parse goes to PostgreSQL as is (coordinator/passthrough.py). So two
event triggers of the store refuse, with 42501, any such change to a relation headrace manages unless the session
is a superuser's (headrace's admin; mirrored roles never are, store/postgres_roles.py):
- `ddl_command_end`: the changed object (a relation, or the relation of an index, rule, trigger or policy) is a
  managed relation; for GRANT and REVOKE, which do not name their objects to an event trigger, any managed
  relation's ACL differs from the one headrace recorded. A superuser's DDL records the ACLs anew (headrace's own
  GRANTs, and the grant PostgreSQL rewrites when the owner changes).
- `sql_drop`: a managed relation is among the dropped objects.
Owner privileges beyond SELECT are revoked from the owner (writes go through headrace), so INSERT, TRUNCATE and
LOCK beyond ACCESS SHARE are PostgreSQL's own 42501.

Event triggers need a superuser: on an external store whose admin is not one, `install` answers False and the
relations stay the admin's (docs/store.md). Managed relations are listed in headrace_internal.managed_relations by
oid (a relation dropped and made again is a new oid: the sync lists it again)."""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import Statement, quote_ident
from headrace.store.table_relation_postgres import relkind

log = logging.getLogger(__name__)

MANAGED_TABLE = "headrace_internal.managed_relations"

_GUARD_DDL = """
CREATE OR REPLACE FUNCTION headrace_internal.guard_managed_ddl() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $guard$
DECLARE
  command record;
  changed oid;
BEGIN
  IF (SELECT rolsuper FROM pg_roles WHERE rolname = session_user) THEN
    IF tg_tag IN ('GRANT', 'REVOKE', 'ALTER TABLE', 'ALTER VIEW', 'CREATE VIEW') THEN
      UPDATE headrace_internal.managed_relations m SET acl = c.relacl FROM pg_class c
       WHERE c.oid = m.relid AND m.acl IS DISTINCT FROM c.relacl;
    END IF;
    RETURN;
  END IF;
  FOR command IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
    changed := NULL;
    IF command.command_tag IN ('GRANT', 'REVOKE') THEN
      SELECT m.relid INTO changed FROM headrace_internal.managed_relations m JOIN pg_class c ON c.oid = m.relid
       WHERE c.relacl IS DISTINCT FROM m.acl LIMIT 1;
    ELSIF command.classid = 'pg_class'::regclass THEN
      changed := coalesce((SELECT indrelid FROM pg_index WHERE indexrelid = command.objid), command.objid);
    ELSIF command.classid = 'pg_rewrite'::regclass THEN
      SELECT ev_class INTO changed FROM pg_rewrite WHERE oid = command.objid;
    ELSIF command.classid = 'pg_trigger'::regclass THEN
      SELECT tgrelid INTO changed FROM pg_trigger WHERE oid = command.objid;
    ELSIF command.classid = 'pg_policy'::regclass THEN
      SELECT polrelid INTO changed FROM pg_policy WHERE oid = command.objid;
    END IF;
    IF changed IS NOT NULL AND EXISTS (SELECT 1 FROM headrace_internal.managed_relations WHERE relid = changed) THEN
      RAISE EXCEPTION 'must change relation % through headrace', changed::regclass
        USING ERRCODE = '42501',
              HINT = 'headrace maintains this relation; it refuses changes it cannot see';
    END IF;
  END LOOP;
END
$guard$;

CREATE OR REPLACE FUNCTION headrace_internal.guard_managed_drop() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $guard$
DECLARE
  dropped record;
BEGIN
  IF (SELECT rolsuper FROM pg_roles WHERE rolname = session_user) THEN
    DELETE FROM headrace_internal.managed_relations m WHERE NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = m.relid);
    RETURN;
  END IF;
  FOR dropped IN SELECT * FROM pg_event_trigger_dropped_objects() LOOP
    IF dropped.classid = 'pg_class'::regclass
       AND EXISTS (SELECT 1 FROM headrace_internal.managed_relations WHERE relid = dropped.objid) THEN
      RAISE EXCEPTION 'must drop relation % through headrace', dropped.object_identity
        USING ERRCODE = '42501', HINT = 'headrace maintains this relation; DROP it as headrace''s object';
    END IF;
  END LOOP;
END
$guard$;
"""

_TRIGGERS = (("headrace_guard_managed_ddl", "ddl_command_end", "headrace_internal.guard_managed_ddl()"),
             ("headrace_guard_managed_drop", "sql_drop", "headrace_internal.guard_managed_drop()"))


def install(store: PostgresServingStore) -> bool:
    """Create the managed-relations table and the guards (idempotent); False when the admin cannot (no superuser)."""
    with store.pool.connection() as conn:
        superuser = bool(conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0])
        if not superuser:
            conn.rollback()
            log.info("the store's admin is not a superuser: relations stay the admin's (no ownership guard)")
            return False
        conn.execute(f"CREATE TABLE IF NOT EXISTS {MANAGED_TABLE} (relid oid PRIMARY KEY, acl aclitem[])")
        conn.execute(_GUARD_DDL)
        for name, event, function in _TRIGGERS:
            exists = conn.execute("SELECT 1 FROM pg_event_trigger WHERE evtname = %s", [name]).fetchone()
            if exists is None:
                conn.execute(f"CREATE EVENT TRIGGER {name} ON {event} EXECUTE FUNCTION {function}")
        conn.commit()
    return True


def give_to_owner(conn: psycopg.Connection[Any], relation: str, owner: str) -> list[Statement]:
    """The statements making `relation` (quoted, qualified) `owner`'s and managed: ownership, no owner privileges
    (store_grants adds SELECT back as headrace's ACL says), and for a view SELECT on what it reads, as PostgreSQL
    checks a view's reads with its owner's privileges (the storage in headrace_internal: the same rows)."""
    quoted_owner = quote_ident(owner)
    kind = relkind(conn, relation)
    if kind is None:
        return []
    statements: list[Statement] = [f"ALTER TABLE {relation} OWNER TO {quoted_owner}", f"REVOKE ALL ON {relation} FROM {quoted_owner}"]
    if kind == "v":
        reads = conn.execute(
            "SELECT DISTINCT quote_ident(n.nspname), quote_ident(c.relname) FROM pg_rewrite r "
            "JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid "
            "JOIN pg_class c ON c.oid = d.refobjid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE r.ev_class = to_regclass(%s) AND d.refobjid <> r.ev_class", [relation]).fetchall()
        for schema in sorted({row[0] for row in reads}):
            statements.append(f"GRANT USAGE ON SCHEMA {schema} TO {quoted_owner}")
        statements += [f"GRANT SELECT ON {schema}.{name} TO {quoted_owner}" for schema, name in reads]
    # its ACL is recorded by the guard itself at the admin's next GRANT / REVOKE (store_grants' follow at once)
    statements.append((f"INSERT INTO {MANAGED_TABLE} (relid) VALUES (to_regclass(?)) ON CONFLICT (relid) DO NOTHING",
                       (relation,)))
    return statements
