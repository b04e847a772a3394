"""Who may read headrace's relations, mirrored into the store PostgreSQL (the PostgreSQL serving store).

Sources', tables' and materialized views' public relations are views the store's admin role owns in the store
PostgreSQL; sessions run their queries there as their own mirrored role (coordinator/passthrough.py). headrace keeps
the privileges (catalog/privileges.py: owner and ACL per relation), and PostgreSQL must enforce the same ones: a
statement PostgreSQL runs without headrace's parser seeing it (syntax headrace does not know) must not read more than
headrace would allow. So each relation gets `GRANT SELECT` to exactly the roles that hold SELECT on it in headrace
(its owner, grantees, PUBLIC) and to headrace's superusers (never PostgreSQL superusers), and nothing else: no
INSERT / UPDATE / DELETE, which go through headrace (a table's writes feed the pipeline; sources and views refuse
them).

`sync()` compares each relation's readers with what it applied last and changes only those that differ; it is cheap
when nothing changed (a signature of the catalog's generation and the roles), so the coordinator calls it before
each statement PostgreSQL runs over headrace's relations, and after DDL, GRANT / REVOKE and role statements.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from headrace.catalog.catalog import Catalog
from headrace.catalog.privileges import PUBLIC, effective
from headrace.catalog.roles import RoleCatalog
from headrace.errors import HeadraceError
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import quote_ident

log = logging.getLogger(__name__)

EnsureRole = Callable[[str, bool], None]  # (role, superuser): mirror it (PostgresStore.ensure_role)


class StoreGrants:
    def __init__(self, catalog: Catalog, roles: RoleCatalog, store: PostgresServingStore,
                 ensure_role: EnsureRole) -> None:
        self._catalog = catalog
        self._roles = roles
        self._store = store
        self._ensure_role = ensure_role
        self._lock = threading.Lock()
        self._signature: object = None
        self._applied: dict[str, tuple[str, frozenset[str]]] = {}  # item id -> (relation, readers)

    def _current_signature(self) -> object:
        return (self._catalog.generation, tuple((r.name, r.superuser) for r in self._roles.list_roles()))

    def up_to_date(self) -> bool:
        return self._signature == self._current_signature()

    def sync(self) -> None:
        """Make the store's SELECT grants on every relation what headrace's privileges say. Blocking."""
        with self._lock:
            signature = self._current_signature()
            if signature == self._signature:
                return
            superusers = frozenset(role.name for role in self._roles.list_roles() if role.superuser)
            wanted = self._readers(superusers)
            mirrored: set[str] = set()
            for item_id, (relation, readers) in wanted.items():
                before = self._applied.get(item_id)
                if before == (relation, readers):
                    continue
                try:
                    for role in sorted(readers - {PUBLIC} - mirrored):
                        self._ensure_role(role, role in superusers)
                        mirrored.add(role)
                    statements = [f"REVOKE ALL ON {relation} FROM PUBLIC"]
                    lost = (before[1] if before is not None and before[0] == relation else frozenset()) - readers
                    statements += [f"REVOKE ALL ON {relation} FROM {_grantee(role)}" for role in sorted(lost)
                                   if role == PUBLIC or self._roles.find(role) is not None]
                    if readers:
                        statements.append(f"GRANT SELECT ON {relation} TO "
                                          + ", ".join(_grantee(role) for role in sorted(readers)))
                    self._store.execute(*statements)
                except HeadraceError as exc:  # e.g. dropped meanwhile: the next sync tries again
                    log.warning("grants on %s not mirrored into the store PostgreSQL: %s", relation, exc.message)
                    signature = None
                    continue
                except Exception as exc:  # noqa: BLE001 - a role the store refuses must not stop the others
                    log.warning("grants on %s not mirrored into the store PostgreSQL: %s", relation, exc)
                    signature = None
                    continue
                self._applied[item_id] = (relation, readers)
            for gone in set(self._applied) - set(wanted):
                del self._applied[gone]
            self._signature = signature

    def _readers(self, superusers: frozenset[str]) -> dict[str, tuple[str, frozenset[str]]]:
        relations = [*((s, "public") for s in self._catalog.sources()),
                     *((t, t.schema) for t in self._catalog.tables()),
                     *((v, v.schema) for v in self._catalog.views())]
        wanted: dict[str, tuple[str, frozenset[str]]] = {}
        for item, schema in relations:
            owner = self._catalog.owner_of(item.id)
            acl = effective(self._catalog.acl_of(item.id), "relation", owner)
            readers = {entry.grantee for entry in acl if "r" in entry.privileges} | superusers
            wanted[item.id] = (f"{quote_ident(schema)}.{quote_ident(item.name)}", frozenset(readers))
        return wanted


def _grantee(role: str) -> str:
    return "PUBLIC" if role == PUBLIC else quote_ident(role)
