"""information_schema rows for the user's relations (the SQL standard's view of the catalog)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from headrace.catalog.system.rows import Row, UserRelation
from headrace.pgwire import types as pg

TABLE_TYPE_BY_RELKIND = {"r": "BASE TABLE", "v": "VIEW", "m": "MATERIALIZED VIEW"}
_CHARACTER_TYPES = {pg.TEXT, pg.VARCHAR, pg.BPCHAR}
_NUMERIC_PRECISION = {pg.INT2: 16, pg.INT4: 32, pg.INT8: 64, pg.FLOAT4: 24, pg.FLOAT8: 53}


def information_schema_rows(relations: Sequence[UserRelation], database: str, owner: str,
                            type_name: Callable[[int], str]) -> dict[str, list[Row]]:
    """type_name: a type's name as format_type prints it ("timestamp with time zone")."""
    tables, columns, views, constraints, key_usage = [], [], [], [], []
    for relation in relations:
        where = {"table_catalog": database, "table_schema": relation.schema, "table_name": relation.name}
        tables.append({**where, "table_type": TABLE_TYPE_BY_RELKIND.get(relation.relkind, "BASE TABLE"),
                       "is_insertable_into": "NO", "is_typed": "NO"})
        if relation.relkind == "v":
            views.append({**where, "view_definition": relation.definition, "check_option": "NONE",
                          "is_updatable": "NO", "is_insertable_into": "NO", "is_trigger_updatable": "NO",
                          "is_trigger_deletable": "NO", "is_trigger_insertable_into": "NO"})
        for number, column in enumerate(relation.columns, start=1):
            element = pg.pg_type(column.type_oid).element_oid
            data_type = "ARRAY" if element else type_name(column.type_oid)
            columns.append({
                **where, "column_name": column.name, "ordinal_position": number,
                "is_nullable": "NO" if column.not_null else "YES", "data_type": data_type,
                "numeric_precision": _NUMERIC_PRECISION.get(column.type_oid),
                "numeric_precision_radix": 2 if column.type_oid in _NUMERIC_PRECISION else None,
                "numeric_scale": 0 if column.type_oid in (pg.INT2, pg.INT4, pg.INT8) else None,
                "character_octet_length": 1073741824 if column.type_oid in _CHARACTER_TYPES else None,
                "udt_catalog": database, "udt_schema": "pg_catalog",
                "udt_name": _udt_name(column.type_oid),
                "dtd_identifier": str(number), "is_self_referencing": "NO", "is_identity": "NO",
                "identity_cycle": "NO", "is_generated": "NEVER", "is_updatable": "NO",
            })
        if relation.primary_key:
            constraint = {"constraint_catalog": database, "constraint_schema": relation.schema,
                          "constraint_name": relation.pkey_name}
            constraints.append({**constraint, **where, "constraint_type": "PRIMARY KEY", "is_deferrable": "NO",
                                "initially_deferred": "NO", "enforced": "YES", "nulls_distinct": None})
            for position, name in enumerate(relation.primary_key, start=1):
                key_usage.append({**constraint, **where, "column_name": name, "ordinal_position": position})
    schemata = [{"catalog_name": database, "schema_name": name, "schema_owner": owner}
                for name in ("information_schema", "pg_catalog", "public")]
    return {"tables": tables, "columns": columns, "views": views, "table_constraints": constraints,
            "key_column_usage": key_usage, "constraint_column_usage": [], "schemata": schemata,
            "enabled_roles": [{"role_name": owner}], "applicable_roles": [],
            "character_sets": [{"character_set_name": "UTF8", "character_repertoire": "UCS",
                                "form_of_use": "UTF8", "default_collate_catalog": database,
                                "default_collate_schema": "pg_catalog", "default_collate_name": "C.UTF-8"}],
            "information_schema_catalog_name": [{"catalog_name": database}]}


_UDT_NAMES = {pg.BOOL: "bool", pg.BYTEA: "bytea", pg.INT8: "int8", pg.INT2: "int2", pg.INT4: "int4",
              pg.TEXT: "text", pg.OID: "oid", pg.JSON: "json", pg.FLOAT4: "float4", pg.FLOAT8: "float8",
              pg.VARCHAR: "varchar", pg.DATE: "date", pg.TIMESTAMP: "timestamp", pg.TIMESTAMPTZ: "timestamptz",
              pg.INTERVAL: "interval", pg.NUMERIC: "numeric", pg.UUID: "uuid", pg.JSONB: "jsonb",
              pg.TIME: "time", pg.BPCHAR: "bpchar", pg.NAME: "name"}


def _udt_name(type_oid: int) -> str:
    """pg_type.typname (arrays: "_int4")."""
    element = pg.pg_type(type_oid).element_oid
    if element:
        return "_" + _udt_name(element)
    return _UDT_NAMES.get(type_oid, "text")
