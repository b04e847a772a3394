"""DBeaver's PostgreSQL driver against a real server: the queries it sends at connect and while browsing (databases,
schemas, data types, tables, columns, constraints, indexes, roles, functions), replayed as pgjdbc sends them:
extended protocol (Parse/Bind/Execute), `?` parameters bound as int8 (setLong) or text (setString).

Where the texts come from (dbeaver/dbeaver, plugins/org.jkiss.dbeaver.ext.postgresql/src/org/jkiss/dbeaver/ext/
postgresql/model/, and the queries a DBeaver 25.1.5 session was seen to send, as recorded by datafusion-postgres's
DBeaver start-up test):
  PostgreDataSource.initialize / determineDefaultObjects: SELECT current_schema(),session_user; SHOW search_path;
      DatabaseCache: SELECT db.oid,db.* FROM pg_catalog.pg_database db WHERE datname=?
  PostgreDataSource (server info): SELECT version(); pg_settings standard_conforming_strings; pg_get_keywords()
  PostgreDataTypeCache: SELECT t.oid,t.*,c.relkind,format_type(...) ... FROM pg_catalog.pg_type t ...
  PostgreDatabase.SchemaCache, RoleCache, AccessMethodCache, TablespaceCache, EncodingCache, ExtensionCache,
      AvailableExtensionCache, LanguageCache, CollationCache
  PostgreSchema.TableCache (lookup, and prepareChildrenStatement for columns), ConstraintCache, IndexCache,
      ProceduresCache; PostgreTableBase statistics (pg_total_relation_size)
  pgjdbc's own type lookups for arrays (TypeInfoCache): n.nspname = ANY(current_schemas(true)), typinput = array_in
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.numeric import Int8

from tests.e2e.server_process import SERVING_ON_POSTGRES, HeadraceProcess

pytestmark = pytest.mark.e2e

SOURCE = "dbv_events"
VIEW = "dbv_totals"
KEYED = "dbv_keyed"

CONNECT = [
    "SET extra_float_digits = 3",
    "SET application_name = 'DBeaver 25.1.5 - Main <headrace>'",
    "SELECT current_schema(),session_user",
    "SELECT current_database(), current_schema(),session_user",
    "SHOW search_path",
    "SELECT version()",
    "SELECT * FROM pg_catalog.pg_settings where name='standard_conforming_strings'",
    "SELECT string_agg(word, ',' ) from pg_catalog.pg_get_keywords() where word <> ALL "
    "('{a,abs,absolute,action,ada,add,admin,after,all,allocate,alter,always,and,any,are,array,as,asc}'::text[])",
    "SELECT * FROM pg_catalog.pg_enum WHERE 1<>1 LIMIT 1",
    "SELECT reltype FROM pg_catalog.pg_class WHERE 1<>1 LIMIT 1",
]
# pgjdbc resolving the array type of a result column (TypeInfoCache), here int4[] (1007) and text[] (1009)
PGJDBC_TYPE_INFO = [
    "SELECT n.nspname = ANY(current_schemas(true)), n.nspname, t.typname FROM pg_catalog.pg_type t "
    "JOIN pg_catalog.pg_namespace n ON t.typnamespace = n.oid WHERE t.oid = %s",
    "SELECT typinput='pg_catalog.array_in'::regproc as is_array, typtype, typname, pg_type.oid "
    "FROM pg_catalog.pg_type LEFT JOIN (select ns.oid as nspoid, ns.nspname, r.r from pg_namespace as ns "
    "join ( select s.r, (current_schemas(false))[s.r] as nspname from generate_series(1, "
    "array_upper(current_schemas(false), 1)) as s(r) ) as r using ( nspname ) ) as sp ON sp.nspoid = typnamespace "
    "WHERE pg_type.oid = %s ORDER BY sp.r, pg_type.oid DESC",
]
DATABASES = "SELECT db.oid,db.* FROM pg_catalog.pg_database db WHERE datname=%s"
DATABASES_ALL = ("SELECT db.oid,db.*\nFROM pg_catalog.pg_database db WHERE NOT datistemplate AND datallowconn\n"
                 "ORDER BY db.datname")
SCHEMAS = ("SELECT n.oid,n.*,d.description FROM pg_catalog.pg_namespace n\n"
           "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=n.oid AND d.objsubid=0 "
           "AND d.classoid='pg_namespace'::regclass\n ORDER BY nspname")
DATA_TYPES = ("SELECT t.oid,t.*,c.relkind,format_type(nullif(t.typbasetype, 0), t.typtypmod) as base_type_name, "
              "d.description\nFROM pg_catalog.pg_type t\nLEFT OUTER JOIN pg_catalog.pg_type et ON et.oid=t.typelem \n"
              "LEFT OUTER JOIN pg_catalog.pg_class c ON c.oid=t.typrelid\n"
              "LEFT OUTER JOIN pg_catalog.pg_description d ON t.oid=d.objoid\nWHERE t.typname IS NOT NULL\n"
              "AND (c.relkind IS NULL OR c.relkind = 'c') AND (et.typcategory IS NULL OR et.typcategory <> 'C')")
DATABASE_CACHES = [
    "SELECT a.oid,a.* FROM pg_catalog.pg_roles a \nORDER BY a.rolname",
    "SELECT am.oid,am.* FROM pg_catalog.pg_am am \nORDER BY am.oid",
    "SELECT t.oid,t.*,pg_tablespace_location(t.oid) loc\nFROM pg_catalog.pg_tablespace t \nORDER BY t.oid",
    "SELECT c.contoencoding as encid,pg_catalog.pg_encoding_to_char(c.contoencoding) as encname\n"
    "FROM pg_catalog.pg_conversion c\nGROUP BY c.contoencoding\nORDER BY 2\n",
    "SELECT c.oid,c.* FROM pg_catalog.pg_collation c \nORDER BY c.oid",
    "SELECT l.oid,l.* FROM pg_catalog.pg_language l \nORDER BY l.oid",
    "SELECT name,default_version,installed_version,comment FROM pg_catalog.pg_available_extensions ORDER BY name",
]
TABLES = ("SELECT c.oid,c.*,d.description,pg_catalog.pg_get_expr(c.relpartbound, c.oid) as partition_expr,  "
          "pg_catalog.pg_get_partkeydef(c.oid) as partition_key \nFROM pg_catalog.pg_class c\n"
          "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=c.oid AND d.objsubid=0 "
          "AND d.classoid='pg_class'::regclass\nWHERE c.relnamespace=%s AND c.relkind not in ('i','I','c')")
TABLE_BY_NAME = TABLES + " AND relname=%s"
_COLUMNS = ("SELECT c.relname,a.*,pg_catalog.pg_get_expr(ad.adbin, ad.adrelid, true) as def_value,dsc.description,"
            "dep.objid\nFROM pg_catalog.pg_attribute a\nINNER JOIN pg_catalog.pg_class c ON (a.attrelid=c.oid)\n"
            "LEFT OUTER JOIN pg_catalog.pg_attrdef ad ON (a.attrelid=ad.adrelid AND a.attnum = ad.adnum)\n"
            "LEFT OUTER JOIN pg_catalog.pg_description dsc ON (c.oid=dsc.objoid AND a.attnum = dsc.objsubid)\n"
            "LEFT OUTER JOIN pg_depend dep on dep.refobjid = a.attrelid AND dep.deptype = 'i' "
            "and dep.refobjsubid = a.attnum and dep.classid = dep.refclassid\n"
            "WHERE NOT a.attisdropped AND c.relkind not in ('i','I','c')")
COLUMNS_OF_TABLE = _COLUMNS + " AND c.oid=%s\nORDER BY a.attnum"
COLUMNS_OF_SCHEMA = _COLUMNS + " AND c.relnamespace=%s\nORDER BY a.attnum"
_CONSTRAINTS = ("SELECT c.oid,c.*,t.relname as tabrelname,rt.relnamespace as refnamespace,d.description, "
                "case when c.contype='c' then \"substring\"(pg_get_constraintdef(c.oid), 7) else null end consrc_copy\n"
                "FROM pg_catalog.pg_constraint c\nINNER JOIN pg_catalog.pg_class t ON t.oid=c.conrelid\n"
                "LEFT OUTER JOIN pg_catalog.pg_class rt ON rt.oid=c.confrelid\n"
                "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=c.oid AND d.objsubid=0 "
                "AND d.classoid='pg_constraint'::regclass\nWHERE ")
CONSTRAINTS_OF_TABLE = _CONSTRAINTS + "c.conrelid=%s\nORDER BY c.oid"
CONSTRAINTS_OF_SCHEMA = _CONSTRAINTS + "t.relnamespace=%s\nORDER BY c.oid"
_INDEXES = ("SELECT i.*,i.indkey as keys,c.relname,c.relnamespace,c.relam,c.reltablespace,tc.relname as tabrelname,"
            "dsc.description,pg_catalog.pg_get_expr(i.indpred, i.indrelid) as pred_expr,"
            "pg_catalog.pg_get_expr(i.indexprs, i.indrelid, true) as expr,"
            "pg_catalog.pg_relation_size(i.indexrelid) as index_rel_size,"
            "pg_catalog.pg_stat_get_numscans(i.indexrelid) as index_num_scans\nFROM pg_catalog.pg_index i\n"
            "INNER JOIN pg_catalog.pg_class c ON c.oid=i.indexrelid\nINNER JOIN pg_catalog.pg_class tc ON tc.oid=i.indrelid\n"
            "LEFT OUTER JOIN pg_catalog.pg_description dsc ON i.indexrelid=dsc.objoid\nWHERE ")
INDEXES_OF_TABLE = _INDEXES + " i.indrelid=%s ORDER BY c.relname"
INDEXES_OF_SCHEMA = _INDEXES + " c.relnamespace=%s ORDER BY c.relname"
TABLE_SIZES = ("select c.oid,pg_catalog.pg_total_relation_size(c.oid) as total_rel_size,"
               "pg_catalog.pg_relation_size(c.oid) as rel_size\nFROM pg_class c\nWHERE c.relnamespace=%s")
PROCEDURES = ("SELECT p.oid as poid,p.*,pg_catalog.pg_get_expr(p.proargdefaults, 0) as arg_defaults,d.description\n"
              "FROM pg_catalog.pg_proc p\nLEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=p.oid "
              "and d.classoid='pg_proc'::regclass  AND d.objsubid = 0\nWHERE p.pronamespace=%s\nORDER BY p.proname")
EXTENSIONS_OF_SCHEMA = ("SELECT \n e.oid,\n cfg.tbls,\n  n.nspname as schema_name,\n e.* \nFROM \n"
                        " pg_catalog.pg_extension e \n join pg_namespace n on n.oid =e.extnamespace\n"
                        " left join  (\n select ARRAY_AGG(ns.nspname || '.' ||  cls.relname) tbls, oid_ext\n"
                        " from ( select unnest(e1.extconfig) oid , e1.oid oid_ext from pg_catalog.pg_extension e1 ) c \n"
                        " join    pg_class cls on cls.oid = c.oid \n join pg_namespace ns on ns.oid = cls.relnamespace\n"
                        " group by oid_ext \n ) cfg on cfg.oid_ext = e.oid\nWHERE e.extnamespace=%s\nORDER BY e.oid")


@pytest.fixture(scope="module")
def dbeaver(server: HeadraceProcess) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    with psycopg.connect(server.dsn, autocommit=True) as setup:
        setup.execute(f"CREATE SOURCE {SOURCE} FROM WEBHOOK BODY FORMAT JSON INCLUDE HEADERS")
        setup.execute(f"CREATE SOURCE {KEYED} FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id')")
        setup.execute(f"CREATE MATERIALIZED VIEW {VIEW} AS SELECT body->>'k' AS k, count(*) AS n "
                      f"FROM {SOURCE} GROUP BY body->>'k'")
    with psycopg.connect(server.dsn, autocommit=True, row_factory=dict_row,
                         application_name="PostgreSQL JDBC Driver") as conn:
        yield conn
    with psycopg.connect(server.dsn, autocommit=True) as teardown:
        teardown.execute(f"DROP SOURCE {SOURCE} CASCADE")
        teardown.execute(f"DROP SOURCE {KEYED}")


def run(conn: psycopg.Connection[dict[str, Any]], sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """As pgjdbc runs a PreparedStatement: extended protocol, every time (prepare=True: Parse once, Bind/Execute)."""
    try:
        return conn.execute(sql, params, prepare=True).fetchall()  # type: ignore[arg-type]
    except psycopg.Error as error:
        raise AssertionError(f"DBeaver query failed: {error.sqlstate} {error}\n{sql}") from error


def test_connect(dbeaver: psycopg.Connection[dict[str, Any]]) -> None:
    results = {sql: run(dbeaver, sql) if not sql.startswith("SET") else dbeaver.execute(sql) for sql in CONNECT}
    assert results["SELECT current_schema(),session_user"] == [{"current_schema": "public", "session_user": "headrace"}]
    assert results["SHOW search_path"][0]["search_path"].endswith("public")
    assert results["SELECT version()"][0]["version"].startswith("PostgreSQL ")
    for type_oid in (1007, 1009):
        for sql in PGJDBC_TYPE_INFO:
            assert run(dbeaver, sql, (Int8(type_oid),)), sql
    # the database is the one the relations are in: "headrace" (DuckDB mode's, and the embedded store's), or on the
    # PostgreSQL serving store the store's own (the tests' stores are databases of one shared cluster)
    [[name]] = [list(row.values()) for row in run(dbeaver, "SELECT current_database()")]
    assert name == "headrace" or SERVING_ON_POSTGRES
    [database] = run(dbeaver, DATABASES, (name,))
    assert database["datname"] == name and database["oid"] > 0
    databases = [row["datname"] for row in run(dbeaver, DATABASES_ALL)]
    assert databases == ["headrace"] or (SERVING_ON_POSTGRES and name in databases)


def test_browse_database(dbeaver: psycopg.Connection[dict[str, Any]]) -> None:
    schemas = {row["nspname"]: row for row in run(dbeaver, SCHEMAS)}
    assert {"public", "pg_catalog", "information_schema"} <= set(schemas)
    types = {row["typname"]: row for row in run(dbeaver, DATA_TYPES)}
    assert types["text"]["typcategory"] == "S" and types["text"]["relkind"] is None
    assert types["int8"]["oid"] == 20 and "timestamptz" in types and "_text" in types
    for sql in DATABASE_CACHES:
        run(dbeaver, sql)
    roles = run(dbeaver, DATABASE_CACHES[0])
    assert "headrace" in [role["rolname"] for role in roles]


def test_browse_schema_tables_columns_constraints_indexes(dbeaver: psycopg.Connection[dict[str, Any]]) -> None:
    public = Int8(next(row["oid"] for row in run(dbeaver, SCHEMAS) if row["nspname"] == "public"))
    tables = {row["relname"]: row for row in run(dbeaver, TABLES, (public,))}
    # a materialized view is a PostgreSQL view on the PostgreSQL serving store (docs/store.md): relkind v
    assert tables[SOURCE]["relkind"] == "r" and tables[VIEW]["relkind"] == ("v" if SERVING_ON_POSTGRES else "m")
    [by_name] = run(dbeaver, TABLE_BY_NAME, (public, SOURCE))
    assert by_name["oid"] == tables[SOURCE]["oid"]

    source_oid = Int8(tables[SOURCE]["oid"])
    columns = run(dbeaver, COLUMNS_OF_TABLE, (source_oid,))
    assert [c["attname"] for c in columns if c["attnum"] > 0][:2] == ["body", "headers"]
    assert all(c["relname"] == SOURCE for c in columns)
    view_columns = run(dbeaver, COLUMNS_OF_TABLE, (Int8(tables[VIEW]["oid"]),))
    assert [c["attname"] for c in view_columns if c["attnum"] > 0] == ["k", "n"]
    assert {c["relname"] for c in run(dbeaver, COLUMNS_OF_SCHEMA, (public,))} >= {SOURCE, VIEW}

    for sql in (CONSTRAINTS_OF_TABLE, INDEXES_OF_TABLE):
        for oid in (source_oid, Int8(tables[VIEW]["oid"])):
            run(dbeaver, sql, (oid,))
    for sql in (CONSTRAINTS_OF_SCHEMA, INDEXES_OF_SCHEMA, TABLE_SIZES, PROCEDURES, EXTENSIONS_OF_SCHEMA):
        run(dbeaver, sql, (public,))
    # as in PostgreSQL, a materialized view has no constraints; a source keyed by IDEMPOTENT has its primary key
    assert run(dbeaver, CONSTRAINTS_OF_TABLE, (Int8(tables[VIEW]["oid"]),)) == []
    [keyed] = run(dbeaver, TABLE_BY_NAME, (public, KEYED))
    [primary_key] = run(dbeaver, CONSTRAINTS_OF_TABLE, (Int8(keyed["oid"]),))
    assert (primary_key["contype"], primary_key["tabrelname"]) == ("p", KEYED)
    key_columns = {c["attnum"]: c["attname"] for c in run(dbeaver, COLUMNS_OF_TABLE, (Int8(keyed["oid"]),))}
    assert [key_columns[n] for n in primary_key["conkey"]] == ["idempotency_key"]
    [index] = run(dbeaver, INDEXES_OF_TABLE, (Int8(keyed["oid"]),))
    assert index["indisprimary"] and index["tabrelname"] == KEYED
    keys = index["keys"]  # int2vector: PostgreSQL sends it as text ("3"), which psycopg does not parse
    keys = [int(n) for n in keys.split()] if isinstance(keys, str) else keys
    assert [key_columns[n] for n in keys] == ["idempotency_key"]
