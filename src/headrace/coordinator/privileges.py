"""Who may do what: PostgreSQL's privilege checks over the catalog's owners and ACLs (catalog/privileges.py), with
its SQLSTATEs and messages (42501 "permission denied for table t", "must be owner of table t").

Superusers pass every check. A session's role exists (coordinator/client.py refuses an unknown one, 28000, as
PostgreSQL does, trust or not); a role dropped while its session lasts holds nothing. Everyone else:
- reads a relation (SELECT, SUBSCRIBE, COPY TO, CREATE SINK FROM, CREATE MATERIALIZED VIEW / INDEX over it) with
  SELECT on it; a materialized view is read with the view's own privilege only (its rows are materialized by
  its owner, who needed SELECT on the inputs when creating it);
- writes a table with INSERT / UPDATE / DELETE, and needs SELECT too where the statement reads its rows (WHERE,
  RETURNING, ON CONFLICT DO UPDATE);
- creates anything in schema public with CREATE on it: not granted to PUBLIC (PostgreSQL 15's default), so a
  superuser must GRANT CREATE ON SCHEMA public TO the role first;
- uses a secret (a source's CHECK, a connection's URL, a sink's option) or a connection (a sink) with USAGE on it;
- drops or alters an object only as its owner (an index: as the owner of its relation).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlglot import exp

from headrace.catalog.catalog import Catalog
from headrace.catalog.items import DEFAULT_SCHEMA
from headrace.catalog.privileges import holds
from headrace.catalog.roles import BOOTSTRAP_SUPERUSER, RoleCatalog
from headrace.errors import HeadraceError

InsufficientPrivilegeState = "42501"


class InsufficientPrivilege(HeadraceError):
    sqlstate = InsufficientPrivilegeState
    http_status = 403


@dataclass(frozen=True, slots=True)
class CatalogObject:
    kind: str  # "source" | "table" | "materialized view" | "sink" | "secret" | "connection"
    name: str
    item_id: str
    schema: str = DEFAULT_SCHEMA

    @property
    def acl_kind(self) -> str:
        return self.kind if self.kind in ("secret", "connection") else "relation"


class Privileges:
    def __init__(self, catalog: Catalog, roles: RoleCatalog) -> None:
        self.catalog = catalog
        self.roles = roles
        self._generation = -1
        self._relations: dict[tuple[str, str], CatalogObject] = {}

    # ---- who ----------------------------------------------------------------------------------------------
    def is_superuser(self, user: str) -> bool:
        role = self.roles.find(user)
        return role is not None and role.superuser  # a dropped role's session keeps no privileges

    def require_superuser(self, user: str, message: str, hint: str | None = None) -> None:
        if not self.is_superuser(user):
            raise InsufficientPrivilege(message, hint=hint)

    # ---- objects ------------------------------------------------------------------------------------------
    def relation(self, schema: str | None, name: str) -> CatalogObject | None:
        """The source, table or materialized view of that name (sinks are no relations to read)."""
        if self._generation != self.catalog.generation:
            relations = {}
            for kind, item_name, item_id in self.catalog.owned_items():
                if kind in ("source", "table", "materialized view"):
                    relations[(DEFAULT_SCHEMA, item_name)] = CatalogObject(kind, item_name, item_id)
            self._relations, self._generation = relations, self.catalog.generation
        return self._relations.get((schema or DEFAULT_SCHEMA, name))

    def named(self, kind: str, schema: str | None, name: str) -> CatalogObject | None:
        schema = schema or DEFAULT_SCHEMA
        found = {"sink": self.catalog.find_sink, "secret": self.catalog.find_secret,
                 "connection": self.catalog.find_connection, "source": self.catalog.find,
                 "table": self.catalog.find_table, "materialized view": self.catalog.find_view}[kind](schema, name)
        return None if found is None else CatalogObject(kind, found.name, found.id, schema)

    # ---- checks -------------------------------------------------------------------------------------------
    def has(self, user: str, target: CatalogObject, letter: str) -> bool:
        if self.is_superuser(user):
            return True
        return holds(self.catalog.acl_of(target.item_id), target.acl_kind, self.catalog.owner_of(target.item_id),
                     user, letter)

    def require(self, user: str, target: CatalogObject, letters: str) -> None:
        if self.is_superuser(user):
            return
        owner, acl = self.catalog.owner_of(target.item_id), self.catalog.acl_of(target.item_id)
        for letter in letters:
            if not holds(acl, target.acl_kind, owner, user, letter):
                raise InsufficientPrivilege(f"permission denied for {target.kind} {target.name}")

    def require_relations(self, user: str, relations: Iterable[tuple[str | None, str]], letters: str = "r") -> None:
        """`letters` on every catalog relation named (other names: system relations, CTEs, errors of their own)."""
        if self.is_superuser(user):
            return
        for schema, name in relations:
            target = self.relation(schema, name)
            if target is not None:
                self.require(user, target, letters)

    def may_read(self, user: str, relations: Iterable[tuple[str | None, str]]) -> bool:
        """require_relations(..., "r") as a yes or no (the fast lane's question: no exception on its path)."""
        if self.is_superuser(user):
            return True
        for schema, name in relations:
            target = self.relation(schema, name)
            if target is not None and not holds(self.catalog.acl_of(target.item_id), target.acl_kind,
                                                self.catalog.owner_of(target.item_id), user, "r"):
                return False
        return True

    def require_owner(self, user: str, target: CatalogObject) -> None:
        if not self.is_superuser(user) and self.catalog.owner_of(target.item_id) != user:
            raise InsufficientPrivilege(f"must be owner of {target.kind} {target.name}")

    def require_owner_of(self, user: str, kind: str, schema: str | None, name: str) -> None:
        target = self.named(kind, schema, name)
        if target is not None:
            self.require_owner(user, target)

    def require_create(self, user: str) -> None:
        """CREATE on schema public (every item lives there)."""
        if not self.is_superuser(user) and not holds(self.catalog.schema_acl, "schema", BOOTSTRAP_SUPERUSER, user,
                                                     "C"):
            raise InsufficientPrivilege(f"permission denied for schema {DEFAULT_SCHEMA}")

    def require_usage(self, user: str, kind: str, qualified_name: str) -> None:
        """USAGE on a secret or connection named as the statement wrote it (possibly schema-qualified)."""
        if self.is_superuser(user):
            return
        schema, _, name = qualified_name.rpartition(".")
        target = self.named(kind, schema.rpartition(".")[2] or None, name)
        if target is not None:
            self.require(user, target, "U")

    # ---- what a statement reads and writes ----------------------------------------------------------------
    def require_write(self, user: str, ast: exp.Expr, target: tuple[str, str]) -> None:
        """INSERT / UPDATE / DELETE on the target table, SELECT where its rows are read, SELECT on the rest."""
        if self.is_superuser(user):
            return
        letters = ""
        if isinstance(ast, exp.Insert):
            letters = "a"
            conflict = ast.args.get("conflict")
            if conflict is not None and conflict.args.get("expressions"):  # ON CONFLICT ... DO UPDATE
                letters += "w" + "r"
        elif isinstance(ast, exp.Update):
            letters = "w" + ("r" if ast.args.get("where") is not None or _reads_columns(ast) else "")
        elif isinstance(ast, exp.Delete):
            letters = "d" + ("r" if ast.args.get("where") is not None else "")
        elif isinstance(ast, exp.TruncateTable):
            letters = "D"
        if ast.args.get("returning") is not None:
            letters += "r"
        others = [(node.db or DEFAULT_SCHEMA, node.name) for node in referenced_tables(ast)]
        target_key = (target[0] or DEFAULT_SCHEMA, target[1])
        if others.count(target_key) > 1:  # INSERT INTO t SELECT ... FROM t, a subquery over t
            letters += "r"
        table = self.relation(*target_key)
        if table is not None:
            self.require(user, table, "".join(dict.fromkeys(letters)))
        self.require_relations(user, [relation for relation in others if relation != target_key])


def referenced_tables(ast: exp.Expr) -> list[exp.Table]:
    """Every table a statement names, CTE names and table functions left out."""
    cte_names = {cte.alias_or_name for cte in ast.find_all(exp.CTE)}
    return [table for table in ast.find_all(exp.Table)
            if table.name and not isinstance(table.this, exp.Func)
            and not (not table.db and table.name in cte_names)]


def _reads_columns(update: exp.Update) -> bool:
    """Whether an UPDATE's SET expressions read the row (`SET v = v + 1`), which needs SELECT in PostgreSQL."""
    return any(True for assignment in update.expressions
               for _ in (assignment.expression.find_all(exp.Column) if isinstance(assignment, exp.EQ) else ()))
