"""headrace's own pg_catalog and information_schema, generated from headrace's catalog.

DuckDB has a pg_catalog of its own, but it describes DuckDB's tables (headrace_internal included) with
DuckDB's OIDs. headrace instead keeps PostgreSQL 15's catalogs, with PostgreSQL's columns and stable
OIDs, as tables of an in-memory DuckDB database attached to the serving store (`hr_system`); the
SELECT translation (sql/select.py) maps pg_catalog.* and information_schema.* onto them.

Rows describing PostgreSQL's built-in objects (types, access methods, ...) are loaded once; rows
describing the user's relations are regenerated whenever the catalog items or roles change (checked
by a cheap fingerprint before each query that reads them).
"""

from __future__ import annotations

import re
import threading
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from headrace.catalog.system import information_schema, rows
from headrace.catalog.system.definitions import (
    SYSTEM_DATABASE,
    SystemRelation,
    _data,
    duckdb_type,
    static_rows,
    system_relations,
)
from headrace.catalog.system.macros import HELPERS, macro_statements
from headrace.catalog.privileges import effective
from headrace.catalog.system.privilege_rows import PrivilegeSource, acl_array, objects_of, privilege_tables
from headrace.catalog.system.user_indexes import add_index_rows
from headrace.catalog.system.rows import Role, TypeFacts, UserColumn, UserRelation
from headrace.catalog.views import MaterializedView
from headrace.sql.types import oid_of_duckdb_type
from headrace.store.serving import PUBLIC_SCHEMA, ServingStore

FIRST_USER_OID = 20000
BOOTSTRAP_ROLE = Role(oid=rows.BOOTSTRAP_SUPERUSER_OID, name="headrace")

ItemsProvider = Callable[[], Sequence[Any]]
# Roles as catalog/roles.py lists them: objects with name, oid, superuser, login.
RolesProvider = Callable[[], Sequence[Any]]


def relation_oid(item_id: str) -> int:
    """Stable across restarts (item ids are never reused); each relation takes 4 OIDs (relation,
    its primary-key index, the constraint, a spare)."""
    match = re.fullmatch(r"[a-z](\d+)", item_id)
    if match:
        return FIRST_USER_OID + 4 * int(match.group(1))
    return FIRST_USER_OID + 4 * (1_000_000 + zlib.crc32(item_id.encode()) % 100_000_000)


def item_kind(item: Any) -> str:
    if isinstance(item, MaterializedView):
        return "materialized view"
    kind = getattr(item, "kind", None)
    return str(kind) if kind else "source"


def item_primary_key(item: Any) -> tuple[str, ...]:
    key = getattr(item, "primary_key", None)
    if key:
        return tuple(key)
    if item_kind(item) == "source" and getattr(item, "idempotent_expr", None) is not None:
        return ("idempotency_key",)
    return ()


def item_not_null(item: Any) -> set[str]:
    declared = set(getattr(item, "not_null_columns", ()) or ())
    if item_kind(item) == "source":
        declared |= {"body", "received_at"}
    return declared | set(item_primary_key(item))


class SystemCatalog:
    def __init__(self, store: ServingStore, items: ItemsProvider, database: str = "headrace",
                 roles: RolesProvider | None = None) -> None:
        self.store = store
        self.items = items
        self.database = database
        self.roles = roles or (lambda: [BOOTSTRAP_ROLE])
        self._lock = threading.Lock()
        self._fingerprint: object = None
        self._installed = False
        self._type_facts = TypeFacts()
        self._type_names: dict[int, str] = {}
        self.indexes: Callable[[], Sequence[Any]] = lambda: ()  # CREATE INDEX definitions (catalog/indexes.py)
        self.privileges: PrivilegeSource | None = None  # owners and ACLs (catalog/catalog.py): relacl, \dp

    def refresh(self) -> None:
        """Make the catalogs describe the current items and roles (blocking: run it in a worker thread)."""
        items = list(self.items())
        roles = [role if isinstance(role, Role) else Role(oid=role.oid, name=role.name, superuser=role.superuser,
                                                            login=role.login, create_role=role.superuser,
                                                            create_db=role.superuser)
                 for role in self.roles()]
        fingerprint = (tuple((item.id, getattr(item, "create_sql", "")) for item in items),
                       tuple((role.oid, role.name, role.superuser, role.login) for role in roles),
                       tuple(self.indexes()), getattr(self.privileges, "generation", None))
        if fingerprint == self._fingerprint:
            return
        with self._lock:
            if fingerprint == self._fingerprint:
                return
            with self.store.cursor() as cursor:
                if not self._installed:
                    self._install(cursor)
                    self._installed = True
                self._load_dynamic(cursor, items, roles)
            self._fingerprint = fingerprint

    # ---- once per process ----------------------------------------------------------------------
    def _install(self, cursor: duckdb.DuckDBPyConnection) -> None:
        attached = {row[0] for row in cursor.execute("SELECT database_name FROM duckdb_databases()").fetchall()}
        if SYSTEM_DATABASE not in attached:
            cursor.execute(f"ATTACH ':memory:' AS {SYSTEM_DATABASE}")
        # PostgreSQL's integer division: int / int truncates (DuckDB's default is a double). The serving store sets it
        # when it opens, then locks its configuration (store/serving.locked_down_config): only set it if not yet so.
        if not cursor.execute("SELECT current_setting('integer_division')").fetchone()[0]:  # type: ignore[index]
            cursor.execute("SET GLOBAL integer_division = true")
        for schema in ("catalog_pg", "catalog_info"):
            cursor.execute(f"CREATE SCHEMA IF NOT EXISTS {SYSTEM_DATABASE}.{schema}")
        for relation in system_relations().values():
            cursor.execute(relation.create_sql().replace("CREATE TABLE", "CREATE OR REPLACE TABLE", 1))
        for statement in macro_statements():
            cursor.execute(statement)
        relations = system_relations()
        for (schema, name), text_rows in static_rows().items():
            relation = relations[(schema, name)]
            _insert(cursor, relation, [dict(zip((c for c, _ in relation.columns),
                                                _parse_text_row(relation, row))) for row in text_rows])
        pg_type = relations[("pg_catalog", "pg_type")]
        names = [c for c, _ in pg_type.columns]
        for row in static_rows()[("pg_catalog", "pg_type")]:
            values = dict(zip(names, row))
            self._type_facts.by_oid[int(values["oid"] or 0)] = (
                int(values["typlen"] or -1), values["typbyval"] == "t", str(values["typalign"]),
                str(values["typstorage"]))
        self._type_names = {int(oid): name for oid, name in _data()["type_names"]}
        cursor.register("hr_type_names", pa.table({"oid": list(self._type_names), "name": list(self._type_names.values())}))
        cursor.execute(f"INSERT INTO {HELPERS}.type_names SELECT * FROM hr_type_names")
        cursor.unregister("hr_type_names")

    # ---- whenever items or roles change --------------------------------------------------------
    def _load_dynamic(self, cursor: duckdb.DuckDBPyConnection, items: Sequence[Any], roles: Sequence[Role]) -> None:
        relations = self._user_relations(cursor, items, roles)
        owner = roles[0].name if roles else "headrace"
        source = self.privileges
        objects = [] if source is None else objects_of(
            source, [(relation_oid(item.id), item.name, item.id) for item in items], self.database)
        privilege_objects, held = privilege_tables(objects, roles)
        from headrace.coordinator.session import default_variables  # session defaults for pg_settings

        pg_rows: dict[str, list[rows.Row]] = {
            # PostgreSQL 15 stores public's ACL explicitly (initdb): shown even while it is the default
            "pg_namespace": rows.namespace_rows(acl_array(effective(None if source is None else source.schema_acl,
                                                                    "schema", "headrace"))),
            "pg_class": rows.class_rows(relations),
            "pg_attribute": rows.attribute_rows(relations, self._type_facts),
            "pg_index": rows.index_rows(relations),
            "pg_constraint": rows.constraint_rows(relations),
            "pg_database": rows.database_rows(self.database,
                                              None if source is None else acl_array(source.database_acl)),
            "pg_settings": rows.settings_rows(_data()["settings"], default_variables(owner, self.database, "")),
            **rows.role_rows(roles),
            **rows.relation_views(relations, owner),
        }
        info_rows = information_schema.information_schema_rows(
            relations, self.database, owner, lambda oid: self._type_names.get(oid, "text"))
        definitions = []
        for relation in relations:
            if relation.definition:
                definitions.append({"oid": relation.oid, "definition": relation.definition})
            if relation.primary_key:
                definitions.append({"oid": relation.index_oid, "definition": rows.index_definition(relation)})
                definitions.append({"oid": relation.constraint_oid,
                                    "definition": f"PRIMARY KEY ({', '.join(relation.primary_key)})"})
        add_index_rows(pg_rows, relations, self.indexes(), self._type_facts, definitions)  # CREATE INDEX ones
        all_relations = system_relations()
        cursor.execute("BEGIN")
        try:
            for name, table_rows in pg_rows.items():
                _replace(cursor, all_relations[("pg_catalog", name)], table_rows)
            for name, table_rows in info_rows.items():
                _replace(cursor, all_relations[("information_schema", name)], table_rows)
            for helper, helper_rows in (("privilege_objects", privilege_objects), ("privileges", held)):
                cursor.execute(f"DELETE FROM {HELPERS}.{helper}")
                if helper_rows:
                    cursor.executemany(f"INSERT INTO {HELPERS}.{helper} VALUES ({', '.join('?' * len(helper_rows[0]))})",
                                       [list(row.values()) for row in helper_rows])
            cursor.execute(f"DELETE FROM {HELPERS}.object_definitions")
            if definitions:
                cursor.executemany(f"INSERT INTO {HELPERS}.object_definitions VALUES (?, ?)",
                                   [[d["oid"], d["definition"]] for d in definitions])
            cursor.execute("COMMIT")
        except BaseException:
            cursor.execute("ROLLBACK")
            raise

    def _user_relations(self, cursor: duckdb.DuckDBPyConnection, items: Sequence[Any],
                        roles: Sequence[Role] = ()) -> list[UserRelation]:
        oid_of_role = {role.name: role.oid for role in roles}
        store_columns: dict[str, list[tuple[str, str]]] = {}
        for table, column, data_type in cursor.execute(
            "SELECT table_name, column_name, data_type FROM duckdb_columns() "
            "WHERE database_name = current_database() AND schema_name = ? ORDER BY table_name, column_index",
            [PUBLIC_SCHEMA],
        ).fetchall():
            store_columns.setdefault(table, []).append((column, data_type))
        relations = []
        for item in items:
            not_null = item_not_null(item)
            known = store_columns.get(item.name)
            if known is None:  # resources not made yet: names from the item, types unknown (text)
                known = [(name, "VARCHAR") for name in (item.column_names() if hasattr(item, "column_names") else [])]
            columns = tuple(UserColumn(name, oid_of_duckdb_type(data_type), name in not_null)
                            for name, data_type in known)
            kind = item_kind(item)
            definition = getattr(item, "definition", None) or (item.create_sql if kind.endswith("view") else None)
            owner = self.privileges.owner_of(item.id) if self.privileges is not None else None
            acl = acl_array(self.privileges.acl_of(item.id)) if self.privileges is not None else None
            relations.append(UserRelation(oid=relation_oid(item.id), schema=getattr(item, "schema", PUBLIC_SCHEMA),
                                          name=item.name, kind=kind, columns=columns,
                                          primary_key=item_primary_key(item), definition=definition,
                                          owner_oid=oid_of_role.get(owner or "", rows.BOOTSTRAP_SUPERUSER_OID),
                                          owner=owner, acl=None if acl is None else tuple(acl)))
        return relations


def _replace(cursor: duckdb.DuckDBPyConnection, relation: SystemRelation, table_rows: list[rows.Row]) -> None:
    cursor.execute(f"DELETE FROM {relation.store_name}")
    _insert(cursor, relation, table_rows)


def _insert(cursor: duckdb.DuckDBPyConnection, relation: SystemRelation, table_rows: list[dict[str, Any]]) -> None:
    if not table_rows:
        return
    names = [name for name, _ in relation.columns]
    unknown = set().union(*table_rows) - set(names)
    if unknown:
        raise ValueError(f"{relation.schema}.{relation.name} has no columns {sorted(unknown)}")
    columns = {}
    for name, type_name in relation.columns:
        values = [row.get(name) for row in table_rows]
        target = duckdb_type(type_name)
        if target.endswith("[]"):
            columns[name] = pa.array(values, type=pa.list_(pa.string() if target.startswith("VARCHAR") else pa.int64()))
        else:
            columns[name] = pa.array(values)
    cursor.register("hr_rows", pa.table(columns))
    try:
        select = ", ".join(f'CAST("{name}" AS {duckdb_type(type_name)})' for name, type_name in relation.columns)
        cursor.execute(f"INSERT INTO {relation.store_name} SELECT {select} FROM hr_rows")
    finally:
        cursor.unregister("hr_rows")


def _parse_text_row(relation: SystemRelation, row: Sequence[str | None]) -> list[Any]:
    """PostgreSQL's text output -> values DuckDB casts from (arrays as lists, booleans as bool)."""
    values: list[Any] = []
    for (name, type_name), text in zip(relation.columns, row):
        target = duckdb_type(type_name)
        if text is None:
            values.append(None)
        elif target.endswith("[]"):
            inner = text.strip("{}")
            items = [part.strip('"') for part in inner.split(",")] if inner else []
            values.append(items if target.startswith("VARCHAR") else [int(part) for part in items])
        elif target == "BOOLEAN":
            values.append(text == "t")
        elif target == "UINTEGER" and not text.isdigit():
            values.append(0)  # a reg* name with no OID of its own here
        else:
            values.append(text)
    return values


__all__ = ["BOOTSTRAP_ROLE", "Role", "SystemCatalog", "relation_oid"]
