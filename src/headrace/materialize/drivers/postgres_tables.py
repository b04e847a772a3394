"""Tables of the PostgreSQL sink driver (drivers/postgres.py): creating and migrating them (Apply), and the per
binding SQL of a transactor (`TablePlan`: temporary tables, COPY, Load queries, DELETE / UPDATE / INSERT)."""

from __future__ import annotations

from typing import Any

import orjson
import psycopg
import pyarrow as pa

from headrace.errors import FeatureNotSupported
from headrace.materialize.drivers.postgres_sql import (
    ORD,
    Read,
    column,
    columnar_read,
    csv_payload,
    document_object,
    ident,
    read_csv,
)
from headrace.materialize.protocol import Binding

CHECKPOINTS = "headrace_sink_checkpoints"
COPY_BATCH_ROWS = 16_384
HISTORY = "headrace_sink_transactions"


def _regclass(conn: psycopg.Connection[Any], schema: str, table: str) -> int | None:
    row = conn.execute("SELECT to_regclass(%s)::oid", [f"{ident(schema)}.{ident(table)}"]).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def existing_columns(conn: psycopg.Connection[Any], schema: str, table: str) -> dict[str, str]:
    """name -> PostgreSQL type (format_type's spelling) of an existing table's columns; {} if it does not exist."""
    oid = _regclass(conn, schema, table)
    if oid is None:
        return {}
    rows = conn.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                        "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum", [oid]).fetchall()
    return {name: type_name for name, type_name in rows}


def primary_key(conn: psycopg.Connection[Any], oid: int) -> list[str]:
    rows = conn.execute("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                        "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND i.indisprimary "
                        "ORDER BY array_position(i.indkey::int2[], a.attnum)", [oid]).fetchall()
    return [name for (name,) in rows]


def _ensure_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    """CREATE SCHEMA only when it is missing: PostgreSQL checks the CREATE privilege on the database even for an
    existing schema, which a sink's role writing into an existing schema need not have."""
    if conn.execute("SELECT FROM pg_namespace WHERE nspname = %s", [schema]).fetchone() is None:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {ident(schema)}")


def ensure_driver_tables(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    """The checkpoints (with fences) and the history of committed transactions, in `schema` (idempotent)."""
    actions = []
    name = ident(schema)
    if _regclass(conn, schema, CHECKPOINTS) is None:
        _ensure_schema(conn, schema)
        conn.execute(f"CREATE TABLE IF NOT EXISTS {name}.{CHECKPOINTS} (materialization text NOT NULL, "
                     "key_begin bigint NOT NULL, key_end bigint NOT NULL, fence bigint NOT NULL, checkpoint jsonb, "
                     "committed_at timestamptz, PRIMARY KEY (materialization, key_begin, key_end))")
        actions.append(f"created {schema}.{CHECKPOINTS}")
    if _regclass(conn, schema, HISTORY) is None:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {name}.{HISTORY} (materialization text NOT NULL, "
                     "key_begin bigint, key_end bigint, fence bigint, checkpoint jsonb, committed_at timestamptz)")
        conn.execute(f"CREATE INDEX IF NOT EXISTS {HISTORY}_by_time ON {name}.{HISTORY} "
                     "(materialization, committed_at)")  # pruning reads the newest rows by it
        actions.append(f"created {schema}.{HISTORY}")
    return actions


def apply_binding(conn: psycopg.Connection[Any], schema: str, table: str, binding: Binding,
                  document_column: str | None) -> list[str]:
    """Create the binding's table, or add its new value columns (nullable). Never drops; a changed key or column
    type is refused."""
    display = f"{schema}.{table}"
    columns = [column(name, binding.column_types[name]) for name in binding.columns]
    target = f"{ident(schema)}.{ident(table)}"
    if document_column is not None and document_column in binding.columns:
        raise FeatureNotSupported(f"document_column {document_column!r} is also a field of {display}")
    oid = _regclass(conn, schema, table)
    if oid is None:
        keyed = not binding.delta_updates
        definitions = [f"{c.sql} {c.pg_type}{' NOT NULL' if keyed and c.name in binding.key else ''}"
                       for c in columns]
        if document_column is not None:
            definitions.append(f"{ident(document_column)} jsonb")
        if keyed:
            definitions.append(f"PRIMARY KEY ({', '.join(ident(k) for k in binding.key)})")
        _ensure_schema(conn, schema)
        conn.execute(f"CREATE TABLE {target} ({', '.join(definitions)})")
        return [f"created table {display}" + (" (append-only)" if binding.delta_updates else "")]
    existing = existing_columns(conn, schema, table)
    key = primary_key(conn, oid)
    if binding.delta_updates and key:
        raise FeatureNotSupported(f"table {display} has a primary key ({', '.join(key)}); a delta-updates sink "
                                  "appends rows to a table without one (use another table)")
    if not binding.delta_updates and sorted(key) != sorted(binding.key):
        raise FeatureNotSupported(
            f"table {display} has primary key ({', '.join(key) or 'none'}), the sink's key is "
            f"({', '.join(binding.key)}): changing the key is not supported (drop the table first)")
    actions = []
    wanted = [(c.name, c.pg_type) for c in columns]
    if document_column is not None:
        wanted.append((document_column, "jsonb"))
    for name, type_name in wanted:
        have = existing.get(name)
        if have is None:
            conn.execute(f"ALTER TABLE {target} ADD COLUMN {ident(name)} {type_name}")
            actions.append(f"added column {name} {type_name} to {display}")
        elif have != type_name:
            raise FeatureNotSupported(f"column {name} of {display} has type {have}, the sink's is {type_name}: "
                                      "changing a column's type is not supported (drop the table first)")
    return actions


class TablePlan:
    """The SQL of one binding for one transactor, built at Open. Temporary tables (per connection, emptied at each
    commit): `headrace_keys_<i>` for Loads and deletions, `headrace_rows_<i>` for updates (and new rows when the
    document column is computed from the columns)."""

    def __init__(self, index: int, schema: str, table: str, binding: Binding, document_column: str | None,
                 changelog: str | None = None, table_columns: list[str] | None = None) -> None:
        """`changelog` (the serving store, store/postgres_serving.py): the quoted changelog table, which every
        write also feeds at the commit's timestamp (-1 for each old row, with all `table_columns`, +1 for each
        new one), in the same statement as the write."""
        self.display = f"{schema}.{table}"
        self.changelog = changelog
        self._every_column = [ident(c) for c in (table_columns or [])]
        self.target = f"{ident(schema)}.{ident(table)}"
        self.delta = binding.delta_updates
        self.keys = [column(name, binding.column_types[name]) for name in binding.key]
        self.values = [column(name, binding.column_types[name]) for name in binding.values]
        self.columns = self.keys + self.values
        self.document = document_column
        self._keys_table = f"pg_temp.headrace_keys_{index}"
        self._rows_table = f"pg_temp.headrace_rows_{index}"
        self._dirty: set[str] = set()  # temporary tables written in the open PostgreSQL transaction
        document = [f"{ident(document_column)} jsonb"] if document_column is not None else []
        self.create_temporary_sql = (
            f"CREATE TEMPORARY TABLE {self._keys_table.split('.')[1]} "
            f"({', '.join([*(f'{c.sql} {c.pg_type}' for c in self.keys), f'{ORD} bigint'])}) "
            "ON COMMIT DELETE ROWS; "
            f"CREATE TEMPORARY TABLE {self._rows_table.split('.')[1]} "
            f"({', '.join([*(f'{c.sql} {c.pg_type}' for c in self.columns), *document])}) ON COMMIT DELETE ROWS")
        self._key_match = " AND ".join(f"t.{c.sql} = s.{c.sql}" for c in self.keys)

    # ------------------------------------------------------------------------------------------ staging

    def _copy(self, cursor: psycopg.Cursor[Any], into: str, names: list[str], table: pa.Table) -> None:
        if into in self._dirty:  # a second use in one transaction starts from an empty table
            cursor.execute(f"TRUNCATE {into}")
        with cursor.copy(f"COPY {into} ({', '.join(names)}) FROM STDIN (FORMAT csv)") as copy:
            # In pieces: PostgreSQL parses one while Arrow (without the GIL) prints the next.
            for batch in table.to_batches(max_chunksize=COPY_BATCH_ROWS):
                copy.write(memoryview(csv_payload(batch)))  # type: ignore[arg-type]
        if into.startswith("pg_temp."):
            self._dirty.add(into)

    def _names(self, table: pa.Table) -> list[str]:
        return [self.document_sql if name == self.document else ident(name) for name in table.column_names]

    @property
    def document_sql(self) -> str:
        assert self.document is not None
        return ident(self.document)

    def transaction_ended(self) -> None:
        self._dirty.clear()  # committed (ON COMMIT DELETE ROWS) or rolled back: the temporary tables are empty

    def copy_keys(self, cursor: psycopg.Cursor[Any], keys: pa.Table, with_ord: bool) -> None:
        names = [c.sql for c in self.keys] + ([ORD] if with_ord else [])
        self._copy(cursor, self._keys_table, names, keys)

    # ------------------------------------------------------------------------------------------ loads

    def _select(self, reads: list[tuple[str, Read]]) -> str:
        selects = ", ".join(read.select for _, read in reads)
        return (f"COPY (SELECT {selects} FROM {self.target} AS t JOIN {self._keys_table} AS s ON {self._key_match}) "
                "TO STDOUT (FORMAT csv)")

    def _copy_out(self, cursor: psycopg.Cursor[Any] | None, reads: list[tuple[str, Read]]) -> pa.Table:
        """The joined rows as CSV, parsed by Arrow (cursor None: none, the table being empty)."""
        chunks = []
        if cursor is not None:
            with cursor.copy(self._select(reads)) as copy:
                for chunk in copy:
                    chunks.append(bytes(chunk))
        return read_csv(b"".join(chunks), reads)

    def is_empty(self, cursor: psycopg.Cursor[Any]) -> bool:
        """Whether the table holds no row (then no Load needs its keys sent: a first, bulk transaction)."""
        return cursor.execute(f"SELECT NOT EXISTS (SELECT FROM {self.target})").fetchone() == (True,)

    def load_documents(self, cursor: psycopg.Cursor[Any]) -> list[tuple[int, dict[str, Any]]]:
        """(position of the Load, stored document) of each staged key the table holds: ONE JSON text built by
        PostgreSQL and parsed by orjson (no Python per column, nor a COPY message per row). A row of the document
        column's table written before that column existed falls back to its columns."""
        built = document_object(self.columns, "t", "json_build_object", hugeint_as_text=True)
        if self.document is not None:
            entry = f"json_build_array(s.{ORD}, t.{self.document_sql}, CASE WHEN t.{self.document_sql} IS NULL " \
                    f"THEN {built} END)"
        else:
            entry = f"json_build_array(s.{ORD}, NULL, {built})"
        row = cursor.execute(f"SELECT convert_to(coalesce(json_agg({entry})::text, '[]'), 'UTF8') "
                             f"FROM {self.target} AS t JOIN {self._keys_table} AS s ON {self._key_match}",
                             binary=True).fetchone()
        assert row is not None
        # HUGEINT came as text; a double as float8's text, which JSON reads as an integer when it has no fraction
        # (2.0 -> 2) or as a string when not finite: both back to a float.
        fixes = [(c.name, int if c.type == "HUGEINT" else float) for c in self.columns
                 if c.type in ("HUGEINT", "DOUBLE", "FLOAT")]
        loaded = []
        for ord_, stored, doc in orjson.loads(row[0]):
            if stored is not None:
                doc = stored
            else:
                for name, fix in fixes:
                    value = doc[name]
                    if value is not None and type(value) is not fix:
                        doc[name] = fix(value)
            loaded.append((ord_, doc))
        return loaded

    def load_columns(self, cursor: psycopg.Cursor[Any] | None) -> pa.Table:
        return self._copy_out(cursor, [(c.name, columnar_read(c, f"t.{c.sql}")) for c in self.columns])

    # ------------------------------------------------------------------------------------------ writes

    def _logged(self, at: int | None) -> bool:
        if self.changelog is not None and at is None:
            raise ValueError(f"{self.display} keeps a changelog: a write needs the commit's timestamp")
        return self.changelog is not None

    def _changelog_insert(self, diff: int, source: str) -> str:
        columns = ", ".join(self._every_column)
        return (f"INSERT INTO {self.changelog} (hr_timestamp, hr_diff, {columns}) "
                f"SELECT %s, {diff}, {', '.join(f'{source}.{c}' for c in self._every_column)}")

    def delete(self, cursor: psycopg.Cursor[Any], keys: pa.Table, at: int | None = None) -> None:
        self.copy_keys(cursor, keys, with_ord=False)
        delete = f"DELETE FROM {self.target} AS t USING {self._keys_table} AS s WHERE {self._key_match}"
        if not self._logged(at):
            cursor.execute(delete)
            return
        cursor.execute(f"WITH gone AS ({delete} RETURNING t.*) {self._changelog_insert(-1, 'gone')} FROM gone", [at])

    def update(self, cursor: psycopg.Cursor[Any], rows: pa.Table, computed_document: bool,
               at: int | None = None) -> None:
        assignments = [f"{c.sql} = s.{c.sql}" for c in self.values]
        if self.document is not None:
            document = document_object(self.columns, "s") if computed_document else f"s.{self.document_sql}"
            assignments.append(f"{self.document_sql} = {document}")
        if not assignments:
            return  # a table of keys only: an existing key stays as it is
        # Every staged row is rewritten, changed or not: a ROW(...) IS DISTINCT FROM filter cost 10-15% of the UPDATE
        # at 100,000 changed rows, and rows stored again unchanged are rare (a changelog's unchanged rewrite
        # consolidates to nothing).
        self._copy(cursor, self._rows_table, self._names(rows), rows)
        update = (f"UPDATE {self.target} AS t SET {', '.join(assignments)} FROM {self._rows_table} AS s "
                  f"WHERE {self._key_match}")
        if not self._logged(at):
            cursor.execute(update)
            return
        # One statement, so the retraction reads the rows as they were before the UPDATE (one snapshot).
        cursor.execute(f"WITH old AS ({self._changelog_insert(-1, 't')} FROM {self.target} AS t "
                       f"JOIN {self._rows_table} AS s ON {self._key_match}), new AS ({update} RETURNING t.*) "
                       f"{self._changelog_insert(1, 'new')} FROM new", [at, at])

    def check_rows(self, cursor: psycopg.Cursor[Any], rows: pa.Table) -> None:
        """COPY `rows` into the temporary rows table only: raises what PostgreSQL refuses in them (the caller
        rolls back to a savepoint afterwards either way)."""
        self._copy(cursor, self._rows_table, self._names(rows), rows)

    def insert(self, cursor: psycopg.Cursor[Any], rows: pa.Table, computed_document: bool,
               at: int | None = None) -> None:
        if self.document is None or not computed_document:
            self._copy(cursor, self.target, self._names(rows), rows)  # straight into the table
            if self._logged(at):  # the same rows, COPYed again into the changelog: cheaper than INSERT ... RETURNING
                logged = rows.add_column(0, "hr_diff", pa.repeat(pa.scalar(1, pa.int64()), rows.num_rows))
                logged = logged.add_column(0, "hr_timestamp", pa.repeat(pa.scalar(at, pa.int64()), rows.num_rows))
                self._copy(cursor, str(self.changelog), ["hr_timestamp", "hr_diff", *self._names(rows)], logged)
            return
        self._copy(cursor, self._rows_table, self._names(rows), rows)
        names = [c.sql for c in self.columns]
        cursor.execute(f"INSERT INTO {self.target} ({', '.join(names)}, {self.document_sql}) "
                       f"SELECT {', '.join(f's.{n}' for n in names)}, {document_object(self.columns, 's')} "
                       f"FROM {self._rows_table} AS s")

