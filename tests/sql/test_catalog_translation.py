"""Translation of PostgreSQL catalog queries onto headrace's system catalog, run against a real
DuckDB serving store with the generated pg_catalog (no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace.catalog.items import WebhookSource
from headrace.catalog.system import SystemCatalog, relation_oid
from headrace.errors import HeadraceError
from headrace.sql.parser import parse_statement
from headrace.sql.select import plan_select
from headrace.store.jsonb import jsonb_text
from headrace.store.query import run_query
from headrace.store.serving import ServingStore

PAYMENTS = WebhookSource(id="u1", name="payments", body_format="json", include_headers=True,
                         idempotent_expr="headers->>'k'", create_sql="CREATE SOURCE payments ...")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ServingStore:
    store = ServingStore(Path(tmp_path_factory.mktemp("catalog")) / "store.duckdb")
    with store.cursor() as cursor:
        cursor.execute("CREATE TABLE public.payments (body JSON, headers JSON, received_at TIMESTAMPTZ, "
                       "idempotency_key VARCHAR)")
    SystemCatalog(store, lambda: [PAYMENTS]).refresh()
    return store


def query(store: ServingStore, sql: str, params: list[object] | None = None) -> list[tuple[object, ...]]:
    plan = plan_select(parse_statement(sql), lambda schema, name: name == "payments", [])
    with store.cursor() as cursor:
        return run_query(cursor, plan, params or [])[1]


def test_psql_describe_lookup(store: ServingStore) -> None:
    rows = query(store, "SELECT c.oid, n.nspname, c.relname FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_namespace n "
                        "ON n.oid = c.relnamespace WHERE c.relname OPERATOR(pg_catalog.~) '^(payments)$' "
                        "COLLATE pg_catalog.default AND pg_catalog.pg_table_is_visible(c.oid) ORDER BY 2, 3")
    assert rows == [(relation_oid("u1"), "public", "payments")]


def test_columns_and_types(store: ServingStore) -> None:
    rows = query(store, "SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull "
                        "FROM pg_catalog.pg_attribute a WHERE a.attrelid = 'payments'::regclass AND a.attnum > 0 "
                        "ORDER BY a.attnum")
    assert rows == [("body", "jsonb", True), ("headers", "jsonb", False),
                    ("received_at", "timestamp with time zone", True), ("idempotency_key", "text", True)]


def test_primary_key_index_and_constraint(store: ServingStore) -> None:
    rows = query(store, "SELECT c2.relname, pg_catalog.pg_get_indexdef(i.indexrelid, 0, true), "
                        "pg_catalog.pg_get_constraintdef(con.oid, true) FROM pg_catalog.pg_index i "
                        "JOIN pg_catalog.pg_class c2 ON c2.oid = i.indexrelid LEFT JOIN pg_catalog.pg_constraint con "
                        "ON conindid = i.indexrelid WHERE i.indrelid = 'payments'::regclass")
    assert rows == [("payments_pkey", "CREATE UNIQUE INDEX payments_pkey ON public.payments USING btree (idempotency_key)",
                     "PRIMARY KEY (idempotency_key)")]


def test_information_schema_and_reg_casts(store: ServingStore) -> None:
    assert query(store, "SELECT table_name, table_type FROM information_schema.tables") == [("payments", "BASE TABLE")]
    assert query(store, "SELECT 'int4'::regtype::text, 25::regtype, to_regtype('jsonb')::oid") == [
        ("integer", "text", 3802)]
    assert query(store, "SELECT c.oid::regclass FROM pg_class c WHERE relkind = 'r'") == [("payments",)]


def test_qualified_columns_and_parameters(store: ServingStore) -> None:
    rows = query(store, "SELECT pg_catalog.pg_class.relname FROM pg_catalog.pg_class "
                        "WHERE pg_catalog.pg_class.relname = $1 AND has_table_privilege($1, 'SELECT')", ["payments"])
    assert rows == [("payments",)]


def test_session_functions_are_parameters(store: ServingStore) -> None:
    plan = plan_select(parse_statement("SELECT current_user, current_setting('TimeZone'), version()"), lambda s, n: False)
    assert sorted(plan.session_inputs) == ["setting:timezone", "user"]
    with pytest.raises(HeadraceError) as error:
        plan_select(parse_statement("SELECT current_setting('jit')"), lambda s, n: False)
    assert error.value.sqlstate == "42704"
    assert query(store, "SELECT current_setting('jit', true) IS NULL") == [(True,)]


def test_division_by_zero_and_integer_division(store: ServingStore) -> None:
    assert query(store, "SELECT 7 / 2, -7 / 2, 7.0 / 2") == [(3, -3, 3.5)]
    for sql in ("SELECT 1 / 0", "SELECT 1 % 0"):
        with pytest.raises(HeadraceError) as error:
            query(store, sql)
        assert error.value.sqlstate == "22012"


def test_unknown_pg_catalog_relation(store: ServingStore) -> None:
    with pytest.raises(HeadraceError) as error:
        query(store, "SELECT * FROM pg_catalog.pg_nothing")
    assert error.value.sqlstate == "42P01"


@pytest.mark.parametrize(("stored", "printed"), [
    ('{"b":1,"aa":2,"a":{"z":null,"y":true},"b":false}', '{"a": {"y": true, "z": null}, "b": false, "aa": 2}'),
    ('[1,2.50,1e2,-0,"x\\n"]', '[1, 2.50, 100, 0, "x\\n"]'),
    ("-0.0", "0.0"), ("{}", "{}"), ('"é"', '"é"'),
])
def test_jsonb_text_is_postgresql_s(stored: str, printed: str) -> None:
    assert jsonb_text(stored) == printed
