"""store/table_reads.py on both serving stores (DuckDB, and PostgreSQL in a fresh database of the shared test
cluster): a table's storage and public relation, the checkpoints' log_end (several key ranges: what all hold), and
the stored rows of keys, read back as the same documents from either store."""

from __future__ import annotations

import base64
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from headrace.catalog.tables import Table
from headrace.sql import table_statements as grammar
from headrace.sql.parser import parse_statement
from headrace.store import table_reads_postgres as on_postgres
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import CHECKPOINTS_TABLE, ServingStore, qualified_name
from headrace.store.table_log import to_document
from headrace.store.table_reads import (Store, applied_checkpoints, applied_ends, public_relation_sql,
                                        rows_for_keys, table_binding)

from ..real_servers.postgres import shared_cluster

_databases = itertools.count()
CREATE = ("CREATE TABLE accounts (id int8, region varchar(8), balance numeric(10,2), opened date, tag uuid, "
          "meta jsonb, photo bytea, at timestamptz, PRIMARY KEY (id, region))")


@pytest.fixture(params=["duckdb", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    serving: Store
    if request.param == "duckdb":
        serving = ServingStore(tmp_path / "store.duckdb")
    else:
        serving = PostgresServingStore(shared_cluster().create_database(f"table_reads_{next(_databases)}"))
    yield serving
    serving.close()


def make_table(store: Store) -> Table:
    table = grammar.table_from_create("t7", parse_statement(CREATE), CREATE)
    store.apply(table_binding(table))
    execute(store, public_relation_sql(table, store.dialect))
    return table


def execute(store: Store, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    if isinstance(store, PostgresServingStore):
        with store.pool.connection() as conn:
            cursor = conn.execute(sql.replace("?", "%s"), params)
            rows = cursor.fetchall() if cursor.description is not None else []
            conn.commit()
            return rows
    with store.cursor() as cursor:
        return cursor.execute(sql, params).fetchall()


def document(table: Table, **values: Any) -> dict[str, Any]:
    row = {name: None for name in table.store_columns()}
    for name, value in values.items():
        column = table.column(name)
        row[name] = to_document(column.pg_type, value, column.max_length, column.precision, column.scale) \
            if column is not None else value
    return row


def store_rows(store: Store, table: Table, rows: list[dict[str, Any]]) -> None:
    """The rows into the storage, as the serving driver would write them (document values in PostgreSQL's / DuckDB's
    input syntax for the column)."""
    names = list(table.store_columns())
    storage = qualified_name(table_binding(table).resource_path)
    relation, parameters = on_postgres.rows_relation(table, names, [[row[c] for c in names] for row in rows], 1)
    if isinstance(store, PostgresServingStore):
        with store.pool.connection() as conn:
            with psycopg.RawCursor(conn) as cursor:
                cursor.execute(f"INSERT INTO {storage} SELECT * FROM ({relation}) AS r", parameters)
            conn.commit()
        return
    types = table.store_columns()
    for row in rows:  # DuckDB: PostgreSQL's input text cast, but bytea's \x text is not DuckDB's BLOB syntax
        values = [base64.b64decode(row[c]) if types[c] == "BLOB" and row[c] is not None
                  else on_postgres.input_text(on_postgres.storage_types(table)[c], row[c]) for c in names]
        casts = ", ".join("NULL" if value is None else "?" if isinstance(value, bytes) else f"CAST(? AS {types[c]})"
                          for c, value in zip(names, values))
        execute(store, f"INSERT INTO {storage} VALUES ({casts})", [value for value in values if value is not None])


def test_public_relation_shows_the_declared_columns(store: Store) -> None:
    table = make_table(store)
    columns = execute(store, "SELECT column_name FROM information_schema.columns WHERE table_schema = 'public' "
                             "AND table_name = 'accounts' ORDER BY ordinal_position")
    assert [name for name, in columns] == table.column_names()  # no hr_version
    assert execute(store, "SELECT count(*) FROM public.accounts") == [(0,)]


def test_checkpoints_read_back_from_either_store(store: Store) -> None:
    make_table(store)
    row = ("INSERT INTO " + CHECKPOINTS_TABLE + " (materialization, key_begin, key_end, fence, checkpoint) "
           "VALUES (?, ?, ?, 1, ?)")
    execute(store, row, ["table_t7", 0, 99, '{"log_end": 120, "views": ["u1", "u2"]}'])
    execute(store, row, ["table_t7", 100, 199, '{"log_end": 80, "views": ["u2"]}'])
    execute(store, row, ["table_t8", 0, 99, None])
    assert applied_checkpoints(store, ["table_t7", "table_t8", "table_t9"]) == {
        "table_t7": (80, frozenset({"u2"})), "table_t8": (0, frozenset()), "table_t9": (0, frozenset())}
    assert applied_ends(store, ["table_t7"]) == {"table_t7": 80}
    assert applied_checkpoints(store, []) == {}


def test_rows_for_keys_are_the_same_documents_from_either_store(store: Store) -> None:
    table = make_table(store)
    first = document(table, id=1, region="eu", balance="12.5", opened="2024-02-29",
                     tag="a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", meta='{"tier": [1, "x"]}', photo=b"\x00\xff",
                     at="2024-05-01 12:00:00.25+02", hr_version=7)
    second = document(table, id=1, region="us", balance=-3, hr_version=8)
    store_rows(store, table, [first, second])
    assert rows_for_keys(store, table, [(1, "eu")]) == {(1, "eu"): first}
    found = rows_for_keys(store, table, [(1, "us"), (1, "eu"), (2, "eu")])
    assert found == {(1, "eu"): first, (1, "us"): second}
    assert first["balance"] == "12.50" and second["balance"] == "-3.00"
    assert rows_for_keys(store, table, []) == {}
