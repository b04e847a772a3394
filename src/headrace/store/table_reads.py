"""Reading a table's current contents from the serving store for writes (blocking: run in the executor).

The serving store holds a table as of its materialization's checkpoint `log_end`; records after it are
acknowledged but not applied yet (the coordinator keeps them in memory: the overlay). The overlay maps keys
to whole rows (None: deleted), so applying it to ANY store state at or after the `log_end` read before the
rows gives the current contents: the store only ever holds a prefix of the log, and a later row for a key
overwrites an earlier one. So no transaction is needed around `applied_end` and the reads that follow it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from headrace.catalog.tables import Table
from headrace.materialize.protocol import Binding
from headrace.store.serving import CHECKPOINTS_TABLE, INTERNAL_SCHEMA, ServingStore, qualified_name, quote_ident
from headrace.store import table_types
from headrace.store import table_reads_postgres as on_postgres
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.table_log import Document, from_store

Store = ServingStore | PostgresServingStore  # branch on store.dialect: "duckdb" / "postgres"

Key = tuple[Any, ...]
_ARROW_TYPES = {"INTEGER": pa.int32(), "BIGINT": pa.int64(), "DOUBLE": pa.float64(), "VARCHAR": pa.string(),
                "BOOLEAN": pa.bool_(), "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"), "JSON": pa.string(),
                "BLOB": pa.binary()}


def _arrow_type(store_type: str) -> pa.DataType:
    return _ARROW_TYPES.get(store_type) or table_types.arrow_type(store_type)


def table_binding(table: Table) -> Binding:
    """The serving-store table of a table: keyed by its primary key (or hidden row id), every column."""
    columns = table.store_columns()
    key = table.store_key
    return Binding(resource_path=(INTERNAL_SCHEMA, table.materialization), key=key,
                   values=tuple(c for c in columns if c not in key), column_types=columns)


def public_relation_sql(table: Table, dialect: str = "duckdb") -> str:
    """The user-visible relation: the declared columns in order (the hidden row id stays hidden); on PostgreSQL
    each cast to its declared type (store/table_reads_postgres.py)."""
    if dialect == "postgres":  # as a view (store/table_relation_postgres.py: a table with a key gets a table)
        from headrace.store.table_relation_postgres import view_sql

        return view_sql(table, qualified_name(table_binding(table).resource_path))
    columns = ", ".join(quote_ident(c) for c in table.column_names())
    return (f"CREATE OR REPLACE VIEW {quote_ident(table.schema)}.{quote_ident(table.name)} AS SELECT {columns} "
            f"FROM {qualified_name(table_binding(table).resource_path)}")


def applied_ends(store: Store, materializations: Sequence[str],
                 cursor: duckdb.DuckDBPyConnection | None = None) -> dict[str, int]:
    """materialization -> the log_end its stored checkpoint says the store holds (0 when none yet)."""
    return {name: end for name, (end, _) in applied_checkpoints(store, materializations, cursor).items()}


def applied_checkpoints(store: Store, materializations: Sequence[str],
                        cursor: duckdb.DuckDBPyConnection | None = None) -> dict[str, tuple[int, frozenset[str]]]:
    """materialization -> (log_end, ids of the views whose state the checkpoint includes)."""
    if not materializations:
        return {}
    if isinstance(store, PostgresServingStore):
        return _checkpoint_ends(materializations, on_postgres.applied_checkpoints(store, materializations))
    own = cursor is None
    cursor = cursor or store.cursor()
    try:
        marks = ", ".join("?" for _ in materializations)
        rows = cursor.execute(f"SELECT materialization, checkpoint FROM {CHECKPOINTS_TABLE} "
                              f"WHERE materialization IN ({marks})", list(materializations)).fetchall()
    finally:
        if own:
            cursor.close()
    return _checkpoint_ends(materializations, rows)


def _checkpoint_ends(materializations: Sequence[str],
                     rows: Sequence[tuple[str, Any]]) -> dict[str, tuple[int, frozenset[str]]]:
    found: dict[str, tuple[int, frozenset[str]]] = {name: (0, frozenset()) for name in materializations}
    seen: set[str] = set()
    for name, checkpoint in rows:
        # DuckDB's JSON and the PostgreSQL store's jsonb come as text; a pool without the text loader parses it
        stored = (json.loads(checkpoint) if isinstance(checkpoint, (str, bytes)) else checkpoint) or {}
        end, views = int(stored.get("log_end", 0)), frozenset(stored.get("views") or ())
        if name in seen:  # several key ranges: what all of them hold
            end, views = min(end, found[name][0]), views & found[name][1]
        seen.add(name)
        found[name] = (end, views)
    return found


def _documents(table: Table, names: Sequence[str], rows: list[tuple[Any, ...]]) -> list[Document]:
    types = table.store_columns()
    converters = [(name, types.get(name)) for name in names]
    return [{name: from_store(type_name, value) if type_name else value
             for (name, type_name), value in zip(converters, row)} for row in rows]


def rows_for_keys(store: Store, table: Table, keys: Sequence[Key]) -> dict[Key, Document]:
    """The stored rows with these keys (absent keys are not in the result)."""
    if not keys:
        return {}
    key_columns = table.store_key
    store_table = qualified_name(table_binding(table).resource_path)
    if isinstance(store, PostgresServingStore):
        names, rows = on_postgres.rows_for_keys(store, table, keys, store_table)
        found = _documents(table, names, rows)
        return {tuple(document[c] for c in key_columns): document for document in found}
    types = table.store_columns()
    with store.cursor() as cursor:
        if len(keys) == 1:
            condition = " AND ".join(f"{quote_ident(c)} = ?" for c in key_columns)
            values = [_parameter_value(table, c, value) for c, value in zip(key_columns, keys[0])]
            result = cursor.execute(f"SELECT * FROM {store_table} WHERE {condition}", values)
        else:
            arrays = {f"k{i}": pa.array([_arrow_value(types[c], key[i]) for key in keys], _arrow_type(types[c]))
                      for i, c in enumerate(key_columns)}
            cursor.register("hr_keys", pa.table(arrays))
            join = " AND ".join(f"s.{quote_ident(c)} = k.k{i}" for i, c in enumerate(key_columns))
            result = cursor.execute(f"SELECT s.* FROM {store_table} s SEMI JOIN hr_keys k ON {join}")
        names = [d[0] for d in result.description]
        documents = _documents(table, names, result.fetchall())
    return {tuple(document[c] for c in key_columns): document for document in documents}


def select_current(store: Store, table: Table, overlay: Mapping[Key, Document | None], select_sql: str,
                   params: Sequence[Any], extra_columns: int) -> list[tuple[Document, tuple[Any, ...]]]:
    """Run `select_sql` (DuckDB, reading the table by its bare name) over the table's current contents: the
    store's rows with `overlay` applied, offered as a CTE of the table's name. The query's first columns
    must be the stored columns (SELECT t.*), then `extra_columns` more; returns (row document, extras).
    DuckDB only: on PostgreSQL, coordinator/table_writes_postgres.py runs the statement's own query."""
    assert isinstance(store, ServingStore)
    types = table.store_columns()
    names = list(types)
    store_table = qualified_name(table_binding(table).resource_path)
    column_list = ", ".join(quote_ident(c) for c in names)
    with store.cursor() as cursor:
        contents = f"SELECT {column_list} FROM {store_table} s"
        if overlay:
            key_columns = table.store_key
            touched = {f"k{i}": pa.array([_arrow_value(types[c], key[i]) for key in overlay], _arrow_type(types[c]))
                       for i, c in enumerate(key_columns)}
            cursor.register("hr_touched", pa.table(touched))
            join = " AND ".join(f"s.{quote_ident(c)} = k.k{i}" for i, c in enumerate(key_columns))
            contents += f" ANTI JOIN hr_touched k ON {join}"
            live = [row for row in overlay.values() if row is not None]
            if live:
                cursor.register("hr_live", pa.table({
                    c: pa.array([_arrow_value(types[c], row.get(c)) for row in live], _arrow_type(types[c]))
                    for c in names}))
                casts = ", ".join(f"CAST({quote_ident(c)} AS {types[c]}) AS {quote_ident(c)}" for c in names)
                contents += f" UNION ALL SELECT {casts} FROM hr_live"
        sql = f"WITH {quote_ident(table.name)} AS ({contents}) {select_sql}"
        result = cursor.execute(sql, list(params) or None)
        rows = result.fetchall()
    count = len(names)
    documents = _documents(table, names, [row[:count] for row in rows])
    return [(document, row[count:count + extra_columns]) for document, row in zip(documents, rows)]


def select_over_pairs(store: Store, table: Table, pairs: Sequence[tuple[Document, Document]],
                      select_sql: str, params: Sequence[Any], excluded_prefix: str,
                      index_column: str) -> list[tuple[Any, ...]]:
    """Run `select_sql` over a relation of the table's name holding, per pair, the existing row's columns, the
    proposed row's as <excluded_prefix><column>, and the pair's index as `index_column` (ON CONFLICT DO UPDATE:
    coordinator/table_upserts.py). Returns the result rows. DuckDB only (PostgreSQL: table_writes_postgres.py)."""
    assert isinstance(store, ServingStore)
    types = table.store_columns()
    arrays: dict[str, pa.Array] = {}
    for prefix, position in (("", 0), (excluded_prefix, 1)):
        for c, store_type in types.items():
            arrays[f"{prefix}{c}"] = pa.array([_arrow_value(store_type, pair[position].get(c)) for pair in pairs],
                                              _arrow_type(store_type))
    arrays[index_column] = pa.array(range(len(pairs)), pa.int64())
    casts = ", ".join(f"CAST({quote_ident(name)} AS {types.get(name.removeprefix(excluded_prefix), 'BIGINT')}) "
                      f"AS {quote_ident(name)}" for name in arrays)
    with store.cursor() as cursor:
        cursor.register("hr_upsert", pa.table(arrays))
        sql = f"WITH {quote_ident(table.name)} AS (SELECT {casts} FROM hr_upsert) {select_sql}"
        return cursor.execute(sql, list(params) or None).fetchall()


def _arrow_value(store_type: str, value: Any) -> Any:
    """A document value as the Arrow column of its store type takes it."""
    if value is None:
        return None
    if store_type == "JSON":
        return json.dumps(value, separators=(",", ":"))
    if store_type == "BLOB":
        import base64

        return base64.b64decode(value)
    return table_types.to_arrow(store_type, value)


def _parameter_value(table: Table, name: str, value: Any) -> Any:
    """A key's document value as a DuckDB query parameter (days, microseconds -> date, datetime, ...)."""
    column = table.column(name)
    if value is None or column is None or column.pg_type not in table_types.EXACT_TYPES:
        return value
    return table_types.to_python(column.pg_type, value)


def row_values(table: Table, document: Document, names: Sequence[str]) -> tuple[Any, ...]:
    """A row document as the values pgwire encodes for the columns `names` (RETURNING)."""
    import base64
    import datetime

    types = table.store_columns()
    values: list[Any] = []
    for name in names:
        value, store_type = document.get(name), types[name]
        if value is not None and store_type == "TIMESTAMPTZ":
            try:
                value = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) \
                    + datetime.timedelta(microseconds=value)
            except OverflowError:
                raise table_types.beyond_python("timestamptz", value) from None
        elif value is not None and store_type == "BLOB":
            value = base64.b64decode(value)
        elif value is not None and store_type == "JSON":
            value = json.dumps(value, separators=(", ", ": "))
        elif value is not None and table_types.is_exact_store_type(store_type):
            column = table.column(name)
            assert column is not None
            value = table_types.to_python(column.pg_type, value)
        values.append(value)
    return tuple(values)
