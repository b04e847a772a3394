"""What DBeaver needs beyond psql's catalog queries, against a real DuckDB serving store (no server): a materialized
view listed in pg_class as relkind 'm', pg_get_keywords() as a table, PostgreSQL array literals cast to arrays,
and the statistics functions DBeaver's index query calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace.catalog.items import WebhookSource
from headrace.catalog.system import SystemCatalog, relation_oid
from headrace.catalog.views import MaterializedView
from headrace.errors import HeadraceError
from headrace.sql.parser import parse_statement
from headrace.sql.select import plan_select
from headrace.store.query import run_query
from headrace.store.serving import ServingStore

EVENTS = WebhookSource(id="u1", name="events", body_format="json", include_headers=False, idempotent_expr=None,
                       create_sql="CREATE SOURCE events ...")
TOTALS = MaterializedView(id="u2", name="totals", create_sql="CREATE MATERIALIZED VIEW totals AS SELECT ...",
                          input_schema="public", input_name="events")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ServingStore:
    store = ServingStore(Path(tmp_path_factory.mktemp("catalog")) / "store.duckdb")
    with store.cursor() as cursor:
        cursor.execute("CREATE TABLE public.events (body JSON, received_at TIMESTAMPTZ)")
        cursor.execute("CREATE VIEW public.totals AS SELECT 'k' AS k, 1::BIGINT AS n")
    SystemCatalog(store, lambda: [EVENTS, TOTALS]).refresh()
    return store


def query(store: ServingStore, sql: str) -> list[tuple[object, ...]]:
    plan = plan_select(parse_statement(sql), lambda schema, name: name in ("events", "totals"), [])
    with store.cursor() as cursor:
        return run_query(cursor, plan, [])[1]


def test_materialized_view_is_a_relation_of_kind_m(store: ServingStore) -> None:
    rows = query(store, "SELECT relname, relkind FROM pg_catalog.pg_class WHERE relnamespace = 2200 ORDER BY relname")
    assert rows == [("events", "r"), ("totals", "m")]
    columns = query(store, f"SELECT attname FROM pg_catalog.pg_attribute WHERE attrelid = {relation_oid('u2')} "
                           "AND attnum > 0 ORDER BY attnum")
    assert columns == [("k",), ("n",)]


def test_pg_get_keywords(store: ServingStore) -> None:
    keywords = dict(query(store, "SELECT word, catcode FROM pg_catalog.pg_get_keywords()"))
    assert keywords["select"] == "R" and keywords["abort"] == "U" and keywords["between"] == "C"
    [(listed,)] = query(store, "SELECT string_agg(word, ',') FROM pg_get_keywords() WHERE word <> ALL "
                               "('{select,from}'::text[]) AND word IN ('select', 'from', 'where')")
    assert listed == "where"


def test_array_literals(store: ServingStore) -> None:
    assert query(store, "SELECT '{1,2,NULL}'::int8[], '{a,\"b c\"}'::text[], '{}'::text[]") == \
        [([1, 2, None], ["a", "b c"], [])]
    with pytest.raises(HeadraceError) as malformed:
        query(store, "SELECT '{a,'::text[]")
    assert malformed.value.sqlstate == "22P02"


def test_statistics_functions_answer_zero(store: ServingStore) -> None:
    assert query(store, "SELECT pg_catalog.pg_stat_get_numscans(1), pg_relation_size(1)") == [(0, 0)]
