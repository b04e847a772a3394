"""Rows of the system catalogs that describe the user's objects, generated from headrace's catalog.

Every relation kind (source, table, materialized view, view) is described the same way, from a
`UserRelation`; a new kind of catalog item appears here with no change beyond its relkind."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from headrace.pgwire import types as pg

BOOTSTRAP_SUPERUSER_OID = 10
PG_CATALOG_OID = 11
PG_TOAST_OID = 99
PUBLIC_OID = 2200
INFORMATION_SCHEMA_OID = 13000
DATABASE_OID = 16384
HEAP_AM_OID = 2
BTREE_AM_OID = 403
DEFAULT_COLLATION_OID = 100
TEXT_BTREE_OPCLASS_OID = 3126

RELKIND_BY_ITEM_KIND = {"source": "r", "table": "r", "materialized view": "m", "view": "v"}
_COLLATABLE = {pg.TEXT, pg.VARCHAR, pg.BPCHAR, pg.NAME}

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class UserColumn:
    name: str
    type_oid: int
    not_null: bool = False


@dataclass(frozen=True, slots=True)
class UserRelation:
    """One catalog item as a relation: what pg_class, pg_attribute and friends say about it."""

    oid: int
    schema: str
    name: str
    kind: str  # catalog item kind: source, table, materialized view, view
    columns: tuple[UserColumn, ...]
    primary_key: tuple[str, ...] = ()
    definition: str | None = None  # a view's query
    owner_oid: int = BOOTSTRAP_SUPERUSER_OID
    owner: str | None = None  # the owner's name (None: the bootstrap superuser)
    acl: tuple[str, ...] | None = None  # relacl in aclitem text form; None: the default (NULL)

    @property
    def relkind(self) -> str:
        return RELKIND_BY_ITEM_KIND.get(self.kind, "r")

    @property
    def index_oid(self) -> int:
        return self.oid + 1

    @property
    def constraint_oid(self) -> int:
        return self.oid + 2

    @property
    def pkey_name(self) -> str:
        return f"{self.name}_pkey"


@dataclass(frozen=True, slots=True)
class Role:
    oid: int
    name: str
    superuser: bool = True
    login: bool = True
    create_role: bool = True
    create_db: bool = True


@dataclass
class TypeFacts:
    """pg_type facts a pg_attribute row copies (attlen, attbyval, attalign, attstorage)."""

    by_oid: dict[int, tuple[int, bool, str, str]] = field(default_factory=dict)

    def of(self, oid: int) -> tuple[int, bool, str, str]:
        return self.by_oid.get(oid, (-1, False, "i", "x"))


def namespace_rows(public_acl: list[str] | None = None) -> list[Row]:
    def row(oid: int, name: str) -> Row:
        return {"oid": oid, "nspname": name, "nspowner": BOOTSTRAP_SUPERUSER_OID,
                "nspacl": public_acl if oid == PUBLIC_OID else None}
    return [row(PG_CATALOG_OID, "pg_catalog"), row(PG_TOAST_OID, "pg_toast"), row(PUBLIC_OID, "public"),
            row(INFORMATION_SCHEMA_OID, "information_schema")]


def class_rows(relations: Sequence[UserRelation]) -> list[Row]:
    rows: list[Row] = []
    for relation in relations:
        is_view = relation.relkind == "v"
        rows.append({**_class_row(relation.oid, relation.name, relation.relkind, len(relation.columns),
                                  am=0 if is_view else HEAP_AM_OID, has_index=bool(relation.primary_key),
                                  has_rules=is_view),
                     "relowner": relation.owner_oid,
                     "relacl": None if relation.acl is None else list(relation.acl)})
        if relation.primary_key:
            rows.append(_class_row(relation.index_oid, relation.pkey_name, "i", len(relation.primary_key),
                                   am=BTREE_AM_OID, has_index=False, has_rules=False))
    return rows


def _class_row(oid: int, name: str, relkind: str, natts: int, am: int, has_index: bool, has_rules: bool) -> Row:
    return {
        "oid": oid, "relname": name, "relnamespace": PUBLIC_OID, "reltype": 0, "reloftype": 0,
        "relowner": BOOTSTRAP_SUPERUSER_OID, "relam": am, "relfilenode": oid, "reltablespace": 0,
        "relpages": 0, "reltuples": -1.0, "relallvisible": 0, "reltoastrelid": 0, "relhasindex": has_index,
        "relisshared": False, "relpersistence": "p", "relkind": relkind, "relnatts": natts, "relchecks": 0,
        "relhasrules": has_rules, "relhastriggers": False, "relhassubclass": False, "relrowsecurity": False,
        "relforcerowsecurity": False, "relispopulated": True, "relreplident": "n" if relkind == "v" else "d",
        "relispartition": False, "relrewrite": 0, "relfrozenxid": 0, "relminmxid": 0,
    }


def attribute_rows(relations: Sequence[UserRelation], facts: TypeFacts) -> list[Row]:
    rows: list[Row] = []
    for relation in relations:
        for number, column in enumerate(relation.columns, start=1):
            rows.append(_attribute_row(relation.oid, number, column, facts))
        if relation.primary_key:
            by_name = {column.name: column for column in relation.columns}
            for number, name in enumerate(relation.primary_key, start=1):
                rows.append(_attribute_row(relation.index_oid, number, by_name[name], facts))
    return rows


def _attribute_row(relation_oid: int, number: int, column: UserColumn, facts: TypeFacts) -> Row:
    length, by_value, align, storage = facts.of(column.type_oid)
    return {
        "attrelid": relation_oid, "attname": column.name, "atttypid": column.type_oid, "attstattarget": -1,
        "attlen": length, "attnum": number, "attndims": 1 if pg.pg_type(column.type_oid).element_oid else 0,
        "attcacheoff": -1, "atttypmod": -1, "attbyval": by_value, "attalign": align, "attstorage": storage,
        "attcompression": "", "attnotnull": column.not_null, "atthasdef": False, "atthasmissing": False,
        "attidentity": "", "attgenerated": "", "attisdropped": False, "attislocal": True, "attinhcount": 0,
        "attcollation": DEFAULT_COLLATION_OID if column.type_oid in _COLLATABLE else 0,
    }


def index_rows(relations: Sequence[UserRelation]) -> list[Row]:
    rows: list[Row] = []
    for relation in relations:
        if not relation.primary_key:
            continue
        numbers = [_attnum(relation, name) for name in relation.primary_key]
        rows.append({
            "indexrelid": relation.index_oid, "indrelid": relation.oid, "indnatts": len(numbers),
            "indnkeyatts": len(numbers), "indisunique": True, "indnullsnotdistinct": False, "indisprimary": True,
            "indisexclusion": False, "indimmediate": True, "indisclustered": False, "indisvalid": True,
            "indcheckxmin": False, "indisready": True, "indislive": True, "indisreplident": False,
            "indkey": numbers, "indcollation": [DEFAULT_COLLATION_OID] * len(numbers),
            "indclass": [TEXT_BTREE_OPCLASS_OID] * len(numbers), "indoption": [0] * len(numbers),
        })
    return rows


def constraint_rows(relations: Sequence[UserRelation]) -> list[Row]:
    rows: list[Row] = []
    for relation in relations:
        if not relation.primary_key:
            continue
        rows.append({
            "oid": relation.constraint_oid, "conname": relation.pkey_name, "connamespace": PUBLIC_OID,
            "contype": "p", "condeferrable": False, "condeferred": False, "convalidated": True,
            "conrelid": relation.oid, "contypid": 0, "conindid": relation.index_oid, "conparentid": 0,
            "confrelid": 0, "confupdtype": " ", "confdeltype": " ", "confmatchtype": " ", "conislocal": True,
            "coninhcount": 0, "connoinherit": True,
            "conkey": [_attnum(relation, name) for name in relation.primary_key],
        })
    return rows


def _attnum(relation: UserRelation, column_name: str) -> int:
    return [column.name for column in relation.columns].index(column_name) + 1


def database_rows(database: str, acl: list[str] | None = None) -> list[Row]:
    return [{"datacl": acl, 
        "oid": DATABASE_OID, "datname": database, "datdba": BOOTSTRAP_SUPERUSER_OID, "encoding": 6,
        "datlocprovider": "c", "datistemplate": False, "datallowconn": True, "datconnlimit": -1,
        "datfrozenxid": 0, "datminmxid": 1, "dattablespace": 1663, "datcollate": "C.UTF-8", "datctype": "C.UTF-8",
    }]


def role_rows(roles: Iterable[Role]) -> dict[str, list[Row]]:
    authid: list[Row] = []
    for role in roles:
        authid.append({
            "oid": role.oid, "rolname": role.name, "rolsuper": role.superuser, "rolinherit": True,
            "rolcreaterole": role.create_role, "rolcreatedb": role.create_db, "rolcanlogin": role.login,
            "rolreplication": False, "rolbypassrls": role.superuser, "rolconnlimit": -1,
        })
    roles_view = [{**row, "rolpassword": "********"} for row in authid]
    users = [{"usename": row["rolname"], "usesysid": row["oid"], "usecreatedb": row["rolcreatedb"],
              "usesuper": row["rolsuper"], "userepl": False, "usebypassrls": row["rolbypassrls"],
              "passwd": "********"} for row in authid if row["rolcanlogin"]]
    return {"pg_authid": authid, "pg_roles": roles_view, "pg_user": users,
            "pg_shadow": [{**user, "passwd": None} for user in users]}


def relation_views(relations: Sequence[UserRelation], owner: str) -> dict[str, list[Row]]:
    """pg_tables, pg_views, pg_matviews and pg_indexes."""
    tables, views, matviews, indexes = [], [], [], []
    for relation in relations:
        common = {"schemaname": relation.schema}
        if relation.relkind == "r":
            tables.append({**common, "tablename": relation.name, "tableowner": relation.owner or owner,
                           "hasindexes": bool(relation.primary_key), "hasrules": False, "hastriggers": False,
                           "rowsecurity": False})
        elif relation.relkind == "v":
            views.append({**common, "viewname": relation.name, "viewowner": relation.owner or owner, "definition": relation.definition})
        elif relation.relkind == "m":
            matviews.append({**common, "matviewname": relation.name, "matviewowner": relation.owner or owner,
                             "hasindexes": bool(relation.primary_key), "ispopulated": True,
                             "definition": relation.definition})
        if relation.primary_key:
            indexes.append({**common, "tablename": relation.name, "indexname": relation.pkey_name,
                            "indexdef": index_definition(relation)})
    return {"pg_tables": tables, "pg_views": views, "pg_matviews": matviews, "pg_indexes": indexes}


def index_definition(relation: UserRelation) -> str:
    columns = ", ".join(relation.primary_key)
    return f"CREATE UNIQUE INDEX {relation.pkey_name} ON {relation.schema}.{relation.name} USING btree ({columns})"


def settings_rows(settings: Sequence[Sequence[Any]], values: dict[str, str]) -> list[Row]:
    """pg_settings: PostgreSQL's descriptions of the settings headrace has (session defaults)."""
    described = {str(entry[0]).lower(): entry for entry in settings}
    rows: list[Row] = []
    for name, value in sorted(values.items()):
        entry = described.get(name)
        if entry is None:
            continue
        canonical, category, short_desc, context, vartype, unit = entry
        rows.append({"name": canonical, "setting": value, "unit": unit, "category": category,
                     "short_desc": short_desc, "context": context, "vartype": vartype, "source": "default",
                     "boot_val": value, "reset_val": value, "pending_restart": False})
    return rows
