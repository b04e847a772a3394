"""Who may read headrace's relations, mirrored into the store PostgreSQL (the PostgreSQL serving store).

Sources', tables' and materialized views' public relations are relations of the store PostgreSQL owned by their
creators (when the store's admin is a superuser, which can guard them against changes headrace does not see:
store/relation_guard_postgres.py; otherwise by the admin); sessions run their queries there as their own mirrored
role (coordinator/passthrough.py). headrace keeps
the privileges (catalog/privileges.py: owner and ACL per relation), and PostgreSQL must enforce the same ones: a
statement PostgreSQL runs without headrace's parser seeing it (syntax headrace does not know) must not read more than
headrace would allow. So each relation gets `GRANT SELECT` to exactly the roles that hold SELECT on it in headrace
(its owner, grantees, PUBLIC) and to headrace's superusers (never PostgreSQL superusers), and nothing else: no
INSERT / UPDATE / DELETE, which go through headrace (a table's writes feed the pipeline; sources and views refuse
them).

`sync()` compares each relation's readers and owner with what it applied last and changes only those that differ
(a relation made again, a new oid, is synced whole); it is cheap
when nothing changed (a signature of the catalog's generation and the roles), so the coordinator calls it before
each statement PostgreSQL runs over headrace's relations, and after DDL, GRANT / REVOKE and role statements.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from headrace.catalog.catalog import Catalog
from headrace.catalog.privileges import PUBLIC, effective
from headrace.catalog.roles import RoleCatalog
from headrace.errors import HeadraceError
from headrace.store import relation_guard_postgres
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import Statement, quote_ident

log = logging.getLogger(__name__)

EnsureRole = Callable[[str, bool], None]  # (role, superuser): mirror it (PostgresStore.ensure_role)


@dataclass(frozen=True)
class Wanted:
    """What one relation's grants and ownership should be; `oid` tells a relation made again from the one synced."""
    relation: str  # quoted, qualified
    readers: frozenset[str]
    owner: str
    oid: int | None


class StoreGrants:
    def __init__(self, catalog: Catalog, roles: RoleCatalog, store: PostgresServingStore,
                 ensure_role: EnsureRole) -> None:
        self._catalog = catalog
        self._roles = roles
        self._store = store
        self._ensure_role = ensure_role
        self._lock = threading.Lock()
        self._signature: object = None
        self._applied: dict[str, Wanted] = {}  # by item id
        # Relations are their creators' only where the store can guard them (store/relation_guard_postgres.py)
        self._owned_by_creators = relation_guard_postgres.install(store)
        self._admin = str(store.execute("SELECT current_user")[0][0])

    def _current_signature(self) -> object:
        return (self._catalog.generation, tuple((r.name, r.superuser) for r in self._roles.list_roles()))

    def up_to_date(self) -> bool:
        return self._signature == self._current_signature()

    def sync(self) -> None:
        """Make the store's SELECT grants on every relation, and its owner, what headrace's privileges say.
        Blocking."""
        with self._lock:
            signature = self._current_signature()
            if signature == self._signature:
                return
            superusers = frozenset(role.name for role in self._roles.list_roles() if role.superuser)
            wanted = self._wanted(superusers)
            mirrored: set[str] = set()
            for item_id, want in wanted.items():
                before = self._applied.get(item_id)
                if before == want:
                    continue
                try:
                    for role in sorted((want.readers | {want.owner}) - {PUBLIC, self._admin} - mirrored):
                        self._ensure_role(role, role in superusers)
                        mirrored.add(role)
                    self._store.execute(*self._statements(want, before))
                except HeadraceError as exc:  # e.g. dropped meanwhile: the next sync tries again
                    log.warning("grants on %s not mirrored into the store PostgreSQL: %s", want.relation, exc.message)
                    signature = None
                    continue
                except Exception as exc:  # noqa: BLE001 - a role the store refuses must not stop the others
                    log.warning("grants on %s not mirrored into the store PostgreSQL: %s", want.relation, exc)
                    signature = None
                    continue
                self._applied[item_id] = want
            for gone in set(self._applied) - set(wanted):
                del self._applied[gone]
            self._signature = signature

    def _statements(self, want: Wanted, before: Wanted | None) -> list[Statement]:
        relation, readers = want.relation, want.readers
        same_relation = before is not None and (before.relation, before.oid) == (relation, want.oid)
        statements: list[Statement] = []
        if self._owned_by_creators and want.owner != self._admin and not (same_relation and before.owner == want.owner):
            with self._store.pool.connection() as conn:
                statements += relation_guard_postgres.give_to_owner(conn, relation, want.owner)
                conn.rollback()
        statements.append(f"REVOKE ALL ON {relation} FROM PUBLIC")
        lost = (before.readers if same_relation else frozenset()) - readers
        statements += [f"REVOKE ALL ON {relation} FROM {_grantee(role)}" for role in sorted(lost)
                       if role == PUBLIC or self._roles.find(role) is not None]
        if readers:
            statements.append(f"GRANT SELECT ON {relation} TO " + ", ".join(_grantee(role) for role in sorted(readers)))
        return statements

    def _wanted(self, superusers: frozenset[str]) -> dict[str, Wanted]:
        relations = [*((s, "public") for s in self._catalog.sources()),
                     *((t, t.schema) for t in self._catalog.tables()),
                     *((v, v.schema) for v in self._catalog.views())]
        names = {item.id: f"{quote_ident(schema)}.{quote_ident(item.name)}" for item, schema in relations}
        oids = dict(self._store.execute(
            ("SELECT name, to_regclass(name)::oid::bigint FROM unnest(?::text[]) AS name", (list(names.values()),))))
        wanted: dict[str, Wanted] = {}
        for item, _ in relations:
            owner = self._catalog.owner_of(item.id)
            acl = effective(self._catalog.acl_of(item.id), "relation", owner)
            readers = {entry.grantee for entry in acl if "r" in entry.privileges} | superusers
            relation = names[item.id]
            wanted[item.id] = Wanted(relation, frozenset(readers), owner, oids.get(relation))
        return wanted


def _grantee(role: str) -> str:
    return "PUBLIC" if role == PUBLIC else quote_ident(role)
