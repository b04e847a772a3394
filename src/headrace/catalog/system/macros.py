"""PostgreSQL's catalog functions as DuckDB macros over headrace's system catalogs.

sql/functions.py rewrites calls such as pg_catalog.format_type(t, m) into calls of these macros
(hr_system.main.hr_format_type(t, m)); each macro takes exactly the arguments listed here."""

from __future__ import annotations

from headrace.catalog.system.definitions import MACRO_SCHEMA, SCHEMA_IN_STORE, SYSTEM_DATABASE

PG = f"{SYSTEM_DATABASE}.{SCHEMA_IN_STORE['pg_catalog']}"
HELPERS = f"{SYSTEM_DATABASE}.main"

# Helper tables the macros read: type names as format_type prints them, and the text of the
# definitions that pg_get_indexdef / pg_get_constraintdef / pg_get_viewdef return.
HELPER_TABLES = {
    "type_names": "oid UINTEGER, name VARCHAR",
    "object_definitions": "oid UINTEGER, definition VARCHAR",
    # has_*_privilege: the objects privileges apply to, and per role each privilege it holds (privilege_rows.py)
    "privilege_objects": "kind VARCHAR, oid UINTEGER, name VARCHAR",
    "privileges": "role VARCHAR, role_oid UINTEGER, kind VARCHAR, oid UINTEGER, privilege VARCHAR",
}

# An object argument of has_*_privilege matched by OID or by (possibly qualified, quoted) name.
_OBJECT_MATCHES = """(o.oid = TRY_CAST(object_arg AS UINTEGER)
        OR o.name = trim(split_part(CAST(object_arg AS VARCHAR), '.', -1), '"'))"""

# name -> (parameters, body)
MACROS: dict[str, tuple[str, str]] = {
    "hr_format_type": ("type_oid, typmod", f"""CASE WHEN type_oid IS NULL THEN NULL ELSE coalesce(
        (SELECT name FROM {HELPERS}.type_names WHERE oid = type_oid), '???') END"""),
    "hr_get_userbyid": ("role_oid", f"""coalesce((SELECT rolname FROM {PG}.pg_authid WHERE oid = role_oid),
        'unknown (OID=' || role_oid || ')')"""),
    "hr_get_definition": ("object_oid, unused_column, unused_pretty", f"(SELECT definition FROM {HELPERS}.object_definitions WHERE oid = object_oid)"),
    "hr_regclass_in": ("relation_text", f"""coalesce((SELECT c.oid FROM {PG}.pg_class c JOIN {PG}.pg_namespace n
        ON n.oid = c.relnamespace WHERE c.relname = trim(split_part(relation_text, '.', -1), '"')
        AND (NOT contains(relation_text, '.') OR n.nspname = trim(split_part(relation_text, '.', 1), '"'))
        ORDER BY n.nspname = 'pg_catalog' DESC LIMIT 1),
        error('relation "' || relation_text || '" does not exist'))"""),
    "hr_to_regclass": ("relation_text", f"""(SELECT c.oid FROM {PG}.pg_class c WHERE c.relname = trim(split_part(relation_text, '.', -1), '"') LIMIT 1)"""),
    "hr_regclass_out": ("class_oid", f"""coalesce((SELECT relname FROM {PG}.pg_class WHERE oid = class_oid), CAST(class_oid AS VARCHAR))"""),
    "hr_to_regtype": ("type_text", f"""(SELECT oid FROM {HELPERS}.type_names WHERE name = lower(trim(type_text))
        UNION ALL SELECT oid FROM {PG}.pg_type WHERE typname = lower(trim(split_part(type_text, '.', -1), '"')) LIMIT 1)"""),
    "hr_regtype_in": ("type_text", f"""coalesce({MACRO_SCHEMA}.hr_to_regtype(type_text),
        error('type "' || type_text || '" does not exist'))"""),
    "hr_regnamespace_in": ("schema_text", f"""coalesce((SELECT oid FROM {PG}.pg_namespace WHERE nspname = schema_text),
        error('schema "' || schema_text || '" does not exist'))"""),
    "hr_regnamespace_out": ("namespace_oid", f"""coalesce((SELECT nspname FROM {PG}.pg_namespace WHERE oid = namespace_oid),
        CAST(namespace_oid AS VARCHAR))"""),
    "hr_regrole_in": ("role_text", f"""coalesce((SELECT oid FROM {PG}.pg_authid WHERE rolname = role_text),
        error('role "' || role_text || '" does not exist'))"""),
    "hr_regproc_in": ("proc_text", f"""coalesce((SELECT oid FROM {PG}.pg_proc WHERE proname = proc_text LIMIT 1),
        error('function "' || proc_text || '" does not exist'))"""),
    "hr_regproc_out": ("proc_oid", f"""CASE WHEN proc_oid = 0 THEN '-' ELSE coalesce(
        (SELECT proname FROM {PG}.pg_proc WHERE oid = proc_oid), CAST(proc_oid AS VARCHAR)) END"""),
    # An unknown role: PostgreSQL's error; an object headrace keeps no ACL for (a system relation) is readable by
    # everyone, as in PostgreSQL.
    "hr_has_privilege": ("role_arg, object_kind, object_arg, privilege_text", f"""CASE
        WHEN NOT EXISTS (SELECT 1 FROM {PG}.pg_authid WHERE rolname = CAST(role_arg AS VARCHAR)
            OR oid = TRY_CAST(role_arg AS UINTEGER))
            THEN error('role "' || CAST(role_arg AS VARCHAR) || '" does not exist')
        WHEN NOT EXISTS (SELECT 1 FROM {HELPERS}.privilege_objects o WHERE o.kind = object_kind
            AND {_OBJECT_MATCHES}) THEN true
        ELSE EXISTS (SELECT 1 FROM {HELPERS}.privileges p JOIN {HELPERS}.privilege_objects o
            ON o.kind = p.kind AND o.oid = p.oid
            WHERE p.kind = object_kind AND (p.role = CAST(role_arg AS VARCHAR) OR p.role_oid = TRY_CAST(role_arg AS UINTEGER))
            AND {_OBJECT_MATCHES}
            AND list_contains(list_transform(string_split(upper(privilege_text), ','),
                              x -> trim(replace(x, 'WITH GRANT OPTION', ''))), p.privilege)) END"""),
    "hr_encoding_to_char": ("encoding", "CASE encoding WHEN 6 THEN 'UTF8' WHEN 0 THEN 'SQL_ASCII' ELSE '' END"),
    "hr_size_pretty": ("size", """CASE WHEN size < 10240 THEN size || ' bytes'
        WHEN size < 10485760 THEN round(size / 1024) || ' kB'
        WHEN size < 10737418240 THEN round(size / 1048576) || ' MB'
        ELSE round(size / 1073741824) || ' GB' END"""),
    "hr_quote_ident": ("identifier", """CASE WHEN regexp_full_match(identifier, '[a-z_][a-z0-9_$]*') THEN identifier
        ELSE '"' || replace(identifier, '"', '""') || '"' END"""),
    "hr_nonzero_divisor": ("divisor", "CASE WHEN divisor = 0 THEN error('division by zero') ELSE divisor END"),
    "hr_array_upper": ("array_value, dimension", "CASE WHEN len(array_value) = 0 THEN NULL ELSE len(array_value) END"),
    "hr_array_lower": ("array_value, dimension", "CASE WHEN len(array_value) = 0 THEN NULL ELSE 1 END"),
}


# name -> body of a table macro (no parameters)
TABLE_MACROS: dict[str, str] = {
    # pg_get_keywords(): DuckDB's parser keeps PostgreSQL's grammar and keyword categories (DBeaver reads this list)
    "hr_get_keywords": """SELECT keyword_name AS word,
        CASE keyword_category WHEN 'unreserved' THEN 'U' WHEN 'column_name' THEN 'C'
            WHEN 'type_function' THEN 'T' ELSE 'R' END AS catcode,
        keyword_category <> 'reserved' AS barelabel,
        CASE keyword_category WHEN 'unreserved' THEN 'unreserved'
            WHEN 'column_name' THEN 'unreserved (cannot be function or type name)'
            WHEN 'type_function' THEN 'reserved (can be function or type name)' ELSE 'reserved' END AS catdesc,
        CASE WHEN keyword_category <> 'reserved' THEN 'can be bare label' ELSE 'requires AS' END AS baredesc
        FROM duckdb_keywords() ORDER BY keyword_name""",
}


def macro_statements() -> list[str]:
    statements = [f"CREATE OR REPLACE TABLE {HELPERS}.{name} ({columns})" for name, columns in HELPER_TABLES.items()]
    statements += [f"CREATE OR REPLACE MACRO {MACRO_SCHEMA}.{name}({parameters}) AS {body}"
                   for name, (parameters, body) in MACROS.items()]
    statements += [f"CREATE OR REPLACE MACRO {MACRO_SCHEMA}.{name}() AS TABLE {body}" for name, body in TABLE_MACROS.items()]
    return statements
