"""Tables on the PostgreSQL serving store (a fresh database of the shared test cluster per test): the public
relation typed as PostgreSQL types the same CREATE TABLE, writes whose queries PostgreSQL evaluates (its answers,
its errors with their SQLSTATEs), upserts, checkpoints read back, and values that round-trip as PostgreSQL's own
INSERT stores them. No pipeline runs: `apply()` does what it would (the acknowledged rows into the storage and
the checkpoint's log_end), so reads go through both the overlay and the store."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from headrace.catalog.catalog import Catalog
from headrace.catalog.tables import Table, TableColumn
from headrace.coordinator.responses import CommandComplete, SendingRows
from headrace.coordinator.session import Session, default_variables
from headrace.coordinator.tables import Tables
from headrace.errors import HeadraceError
from headrace.sql.ddl import item_from_create_sql
from headrace.sql.parser import parse_statement
from headrace.materialize.drivers.postgres_serving import PostgresServingConnector, PostgresServingTransactor
from headrace.materialize.hosting import ThreadedDriverServer
from headrace.materialize.protocol import MaterializationSpec
from headrace.store import table_reads_postgres as on_postgres
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import CHECKPOINTS_TABLE
from headrace.store.table_reads import applied_checkpoints, rows_for_keys, table_binding

from ..real_servers.postgres import shared_cluster

_databases = itertools.count()
TYPES_TABLE = ("CREATE TABLE kinds (id int8 PRIMARY KEY, s int2, i int4 NOT NULL DEFAULT 42, r float4, d float8, t text, "
               "v varchar(10), c char(3), b bool, ts timestamptz, j json, jb jsonb, by bytea, n numeric(12,2), "
               "nu numeric, day date, at timestamp, u uuid, span interval)")


@pytest.fixture
def store() -> Iterator[PostgresServingStore]:
    serving = PostgresServingStore(shared_cluster().create_database(f"tables_{next(_databases)}"))
    yield serving
    for key in [key for key in _runtimes if key[0] == id(serving)]:
        _runtimes.pop(key).close()
    server = _driver_servers.pop(id(serving), None)
    if server is not None:
        server.stop()
    serving.close()


def drive(store: PostgresServingStore, data: Path, body: Callable[[Tables], Awaitable[None]]) -> None:
    """Run `body` with the tables of a coordinator over `store` (its catalog and logs in `data`)."""
    async def scenario() -> None:
        executor = ThreadPoolExecutor(4)
        catalog = Catalog(data, item_from_create_sql)
        tables = Tables(catalog, store, executor, data, asyncio.Lock(), lambda: None,
                        lambda schema, name: catalog.find_table(schema, name) is not None)
        await tables.open_all()
        try:
            await body(tables)
        finally:
            await tables.close_all()
            executor.shutdown()

    asyncio.run(scenario())


def new_session() -> Session:
    return Session(user="headrace", database="headrace", variables=default_variables("headrace", "headrace", "t"))


async def run(tables: Tables, sql: str, params: tuple[Any, ...] = (), session: Session | None = None) -> Any:
    return await tables.execute(session or new_session(), parse_statement(sql), sql, params)


def query(store: PostgresServingStore, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with store.pool.connection() as conn:
        return conn.execute(sql, params).fetchall()


def apply(store: PostgresServingStore, tables: Tables, table: Table) -> None:
    """What the pipeline does for the table (pipeline/table_batches.py): one transaction of the serving driver
    (materialize/drivers/postgres_serving.py) storing each acknowledged row the store lacks (a deletion for a
    deleted key), its checkpoint's log_end the log's end."""
    table_log = tables._logs[table.id]
    overlay = table_log.overlay(tables._applied.get(table.id, 0))
    documents: list[tuple[int, list[Any], dict[str, Any]]] = []
    for key, row in overlay.items():
        documents.append((0, list(key), row if row is not None
                          else {**dict(zip(table.store_key, key)), "_meta": {"op": "d"}}))
    server = _driver_servers.get(id(store))
    if server is None:
        server = _driver_servers[id(store)] = ThreadedDriverServer(lambda _open: PostgresServingTransactor(store),
                                                                   PostgresServingConnector(store))
    runtime = _runtimes.get((id(store), table.materialization))
    if runtime is None:
        spec = MaterializationSpec(name=table.materialization, bindings=(table_binding(table),))
        runtime = _runtimes[(id(store), table.materialization)] = server.runtime(spec)
        runtime.open()
    runtime.transact(documents, {"epoch": 1, "batch_id": next(_batches), "log_end": table_log.acked_end})


_driver_servers: dict[int, ThreadedDriverServer] = {}
_runtimes: dict[tuple[int, str], Any] = {}
_batches = itertools.count(1)


def table_of(tables: Tables, name: str) -> Table:
    return tables.table_named("public", name)


def test_public_relation_is_typed_as_postgresql_types_the_same_table(store: PostgresServingStore, tmp_path: Path) -> None:
    drive(store, tmp_path, lambda tables: _public_relation_is_typed_as_postgresql_types_the_same_table(tables, store))


async def _public_relation_is_typed_as_postgresql_types_the_same_table(tables: Tables, store: PostgresServingStore) -> None:
    await run(tables, TYPES_TABLE)
    with store.pool.connection() as conn:
        conn.execute("CREATE SCHEMA plain")
        conn.execute(TYPES_TABLE.replace("kinds", "plain.kinds"))
        conn.commit()
    public = query(store, COLUMNS, ["public.kinds"])
    assert public == query(store, COLUMNS, ["plain.kinds"])
    assert ("v", "character varying(10)", False, None) in public and ("s", "smallint", False, None) in public
    # a table with a key is a real table (psql: "Table", its key, SQLAlchemy reflects it), kept by triggers
    assert query(store, "SELECT relkind FROM pg_class WHERE oid = 'public.kinds'::regclass") == [("r",)]
    assert query(store, CONSTRAINTS, ["public.kinds"]) == [("kinds_pkey", "PRIMARY KEY (id)")]
    await run(tables, "CREATE TABLE loose (a int4 NOT NULL, b text DEFAULT 'xy')")  # no key: a view
    with store.pool.connection() as conn:
        conn.execute("CREATE TABLE plain.loose (a int4 NOT NULL, b text DEFAULT 'xy')")
        conn.commit()
    assert query(store, "SELECT relkind FROM pg_class WHERE oid = 'public.loose'::regclass") == [("v",)]
    assert [row[:2] for row in query(store, COLUMNS, ["public.loose"])] == \
        [row[:2] for row in query(store, COLUMNS, ["plain.loose"])]


COLUMNS = ("SELECT attname, format_type(atttypid, atttypmod), attnotnull, pg_get_expr(d.adbin, d.adrelid) "
           "FROM pg_attribute a LEFT JOIN pg_attrdef d ON (d.adrelid, d.adnum) = (a.attrelid, a.attnum) "
           "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum")
CONSTRAINTS = "SELECT conname::text, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass"


def test_values_round_trip_as_postgresql_stores_them(store: PostgresServingStore, tmp_path: Path) -> None:
    drive(store, tmp_path, lambda tables: _values_round_trip_as_postgresql_stores_them(tables, store))


async def _values_round_trip_as_postgresql_stores_them(tables: Tables, store: PostgresServingStore) -> None:
    await run(tables, TYPES_TABLE)
    values = ("(1, 7, -8, 1.1, 0.1, 'x', 'abc', 'ab', true, '2024-05-01 12:00:00+02', '[1, {\"a\": 2}]', "
              "'{\"b\": 1, \"a\": [true]}', '\\x00ff', 1.005, 2.5, '2024-02-29', '2024-02-29 23:59:59.123456', "
              "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', '1 day 02:03:04.5')")
    await run(tables, f"INSERT INTO kinds VALUES {values}")
    await run(tables, "INSERT INTO kinds (id, r, n, v, c) VALUES (2, 1.1::float8 * 3, 10.0 / 3, "
                      "upper('abc') || 'def', 'z' || '')")
    # not applied yet: each row goes through the overlay (every type to PostgreSQL and back) before it is stored
    update = "UPDATE kinds SET s = s + 1, t = t || '!', d = d * 2 WHERE id = 1 OR r > 3"
    assert await run(tables, update) == CommandComplete("UPDATE 2")
    apply(store, tables, table_of(tables, "kinds"))
    with store.pool.connection() as conn:
        conn.execute("CREATE TEMPORARY TABLE plain_kinds " + TYPES_TABLE.removeprefix("CREATE TABLE kinds"))
        conn.execute(f"INSERT INTO plain_kinds VALUES {values}")
        conn.execute("INSERT INTO plain_kinds (id, r, n, v, c) VALUES (2, 1.1::float8 * 3, 10.0 / 3, "
                     "upper('abc') || 'def', 'z' || '')")
        conn.execute(update.replace("kinds", "plain_kinds"))
        # not compared (docs/tables.md): json (kept as jsonb's normal form, not its input text), unconstrained
        # numeric (held at scale 10), interval (held as microseconds: '1 day 02:00' reads back as '26:00:00')
        columns = "s, i, r, d, t, v, c, b, ts, jb, by, n, day, at, u"
        ours = conn.execute(f"SELECT id, ({columns})::text FROM public.kinds ORDER BY id").fetchall()
        theirs = conn.execute(f"SELECT id, ({columns})::text FROM plain_kinds ORDER BY id").fetchall()
    assert ours == theirs
    assert ours[1][1].startswith("(,42,3.3,,,ABCdef,\"z  \",")  # rounded to real, PostgreSQL's text, char(3) padded


def test_update_and_delete_are_evaluated_by_postgresql(store: PostgresServingStore, tmp_path: Path) -> None:
    drive(store, tmp_path, lambda tables: _update_and_delete_are_evaluated_by_postgresql(tables, store))


async def _update_and_delete_are_evaluated_by_postgresql(tables: Tables, store: PostgresServingStore) -> None:
    await run(tables, "CREATE TABLE t (id int4 PRIMARY KEY, x int4, y text, s int2, v varchar(3))")
    await run(tables, "INSERT INTO t VALUES (1, 7, 'abc', 1, 'a'), (2, 9, 'xyz', 2, 'b'), (3, -7, 'bar', 3, 'c')")
    table = table_of(tables, "t")
    apply(store, tables, table)
    # integer division and a POSIX regular expression: PostgreSQL's (DuckDB's / is float division)
    assert await run(tables, "UPDATE t SET x = x / 2 WHERE y ~ 'a'") == CommandComplete("UPDATE 2")
    await run(tables, "INSERT INTO t VALUES (4, 1, 'new', 4, 'd')")  # unapplied: read through the overlay
    result = await run(tables, "UPDATE t SET x = x * 10 WHERE id >= $1 RETURNING id, x", ("3",))
    assert isinstance(result, SendingRows) and sorted(result.rows) == [(3, -30), (4, 10)]
    for statement, sqlstate, message in (
            ("UPDATE t SET x = x / 0", "22012", "division by zero"),
            ("UPDATE t SET s = s * 100000", "22003", "smallint out of range"),
            ("UPDATE t SET v = y || y WHERE id = 1", "22001", "value too long for type character varying(3)"),
            ("DELETE FROM t WHERE y::int > 0", "22P02", 'invalid input syntax for type integer: "abc"'),
            ("UPDATE t SET x = pg_read_file('/etc/passwd')::int", "42501",
             "permission denied for function pg_read_file")):
        with pytest.raises(HeadraceError) as caught:
            await run(tables, statement)
        assert (caught.value.sqlstate, caught.value.message) == (sqlstate, message), statement
    assert await run(tables, "DELETE FROM t WHERE y LIKE 'b%' OR x % 2 = 1") == CommandComplete("DELETE 3")
    apply(store, tables, table)
    assert query(store, "SELECT id, x, y FROM public.t ORDER BY id") == [(4, 10, "new")]


def test_insert_select_reads_other_relations_in_postgresql(store: PostgresServingStore, tmp_path: Path) -> None:
    drive(store, tmp_path, lambda tables: _insert_select_reads_other_relations_in_postgresql(tables, store))


async def _insert_select_reads_other_relations_in_postgresql(tables: Tables, store: PostgresServingStore) -> None:
    await run(tables, "CREATE TABLE a (id int4 PRIMARY KEY, name text)")
    await run(tables, "CREATE TABLE b (id int4 PRIMARY KEY, name varchar(5), at date)")
    await run(tables, "INSERT INTO a VALUES (1, 'one'), (2, 'two'), (3, 'three!')")
    apply(store, tables, table_of(tables, "a"))
    await run(tables, "INSERT INTO b SELECT id, initcap(name), date '2024-01-31' + id FROM a WHERE id < 3")
    apply(store, tables, table_of(tables, "b"))
    assert query(store, "SELECT id, name, at::text FROM b ORDER BY id") == [(1, "One", "2024-02-01"),
                                                                            (2, "Two", "2024-02-02")]
    with pytest.raises(HeadraceError) as caught:
        await run(tables, "INSERT INTO b (id, name) SELECT id + 10, name FROM a")
    assert caught.value.sqlstate == "22001"  # 'three!' does not fit varchar(5): PostgreSQL's assignment


def test_upserts_on_postgresql(store: PostgresServingStore, tmp_path: Path) -> None:
    drive(store, tmp_path, lambda tables: _upserts_on_postgresql(tables, store))


async def _upserts_on_postgresql(tables: Tables, store: PostgresServingStore) -> None:
    await run(tables, "CREATE TABLE counts (k text PRIMARY KEY, n int4 NOT NULL, note varchar(4))")
    await run(tables, "INSERT INTO counts VALUES ('a', 1, 'x'), ('b', 5, 'y')")
    table = table_of(tables, "counts")
    apply(store, tables, table)
    upsert = ("INSERT INTO counts AS c VALUES ($1, $2, $3) ON CONFLICT (k) DO UPDATE "
              "SET n = c.n + EXCLUDED.n, note = c.note || EXCLUDED.note WHERE c.n < 5 RETURNING k, n, note")
    result = await run(tables, upsert, ("a", 2, "z"))
    assert isinstance(result, SendingRows) and result.rows == [("a", 3, "xz")]
    assert await run(tables, upsert.removesuffix(" RETURNING k, n, note"), ("b", 1, "!")) == CommandComplete("INSERT 0 0")
    with pytest.raises(HeadraceError) as caught:  # WHERE holds, SET's value does not fit: PostgreSQL's 22001
        await run(tables, upsert, ("a", 1, "zzz"))
    assert caught.value.sqlstate == "22001"
    # SET is not evaluated where WHERE rejects the row (division by zero never happens for 'b')
    assert await run(tables, "INSERT INTO counts VALUES ('b', 0) ON CONFLICT (k) DO UPDATE SET n = 1 / EXCLUDED.n "
                             "WHERE counts.n < 5") == CommandComplete("INSERT 0 0")
    apply(store, tables, table)
    assert query(store, "SELECT k, n, note FROM counts ORDER BY k") == [("a", 3, "xz"), ("b", 5, "y")]


def test_checkpoints_and_rows_read_back(store: PostgresServingStore, tmp_path: Path) -> None:
    drive(store, tmp_path, lambda tables: _checkpoints_and_rows_read_back(tables, store))


async def _checkpoints_and_rows_read_back(tables: Tables, store: PostgresServingStore) -> None:
    await run(tables, "CREATE TABLE k2 (a int4, b uuid, v numeric(6,2), PRIMARY KEY (a, b))")
    await run(tables, "INSERT INTO k2 VALUES (1, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 1.5), "
                      "(2, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12', 2)")
    table = table_of(tables, "k2")
    apply(store, tables, table)
    end = tables._logs[table.id].acked_end
    assert applied_checkpoints(store, [table.materialization, "nothing"]) == {
        table.materialization: (end, frozenset()), "nothing": (0, frozenset())}
    found = rows_for_keys(store, table, [(2, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12"), (3, "a0eebc99-9c0b-4ef8-bb6d"
                                                                                         "-6bb9bd380a11")])
    assert list(found) == [(2, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12")]
    assert found[(2, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12")]["v"] == "2.00"


def test_drop_table_with_a_dependent_store_view(store: PostgresServingStore, tmp_path: Path) -> None:
    drive(store, tmp_path, lambda tables: _drop_table_with_a_dependent_store_view(tables, store))


async def _drop_table_with_a_dependent_store_view(tables: Tables, store: PostgresServingStore) -> None:
    await run(tables, "CREATE TABLE d (id int4 PRIMARY KEY)")
    with store.pool.connection() as conn:
        conn.execute("CREATE VIEW over_d AS SELECT id FROM d")
        conn.commit()
    with pytest.raises(HeadraceError) as caught:
        await run(tables, "DROP TABLE d")
    assert caught.value.sqlstate == "2BP01" and caught.value.detail == "view over_d depends on table d"
    await run(tables, "DROP TABLE d CASCADE")
    assert query(store, "SELECT to_regclass('public.d'), to_regclass('public.over_d')") == [(None, None)]


def test_describe_types_parameters_as_postgresql(store: PostgresServingStore, tmp_path: Path) -> None:
    drive(store, tmp_path, lambda tables: _describe_types_parameters_as_postgresql(tables, store))


async def _describe_types_parameters_as_postgresql(tables: Tables, store: PostgresServingStore) -> None:
    await run(tables, "CREATE TABLE p (id int8 PRIMARY KEY, v varchar(5), r float4, day date)")

    async def parameters(sql: str, declared: tuple[int, ...] = ()) -> tuple[int, ...]:
        return (await tables.describe(parse_statement(sql), declared)).param_types

    assert await parameters("UPDATE p SET v = $2 WHERE day < $1") == (1082, 1043)
    assert await parameters("UPDATE p SET r = r * $1 WHERE day < $2::date + 1") == (700, 1082)
    assert await parameters("DELETE FROM p WHERE id = $1 OR r > $2") == (20, 700)
    assert await parameters("INSERT INTO p SELECT $1 + 1, upper($2)") == (23, 25)
    assert await parameters("INSERT INTO p VALUES ($1, $2 || 'x')", (20,)) == (20, 25)
    with pytest.raises(HeadraceError) as caught:
        await parameters("UPDATE p SET v = $2")
    assert caught.value.sqlstate == "42P18"  # could not determine data type of parameter $1, as PostgreSQL says


def test_writes_read_their_own_table_and_compute_on_declared_types(store: PostgresServingStore,
                                                                    tmp_path: Path) -> None:
    drive(store, tmp_path, lambda tables: _writes_read_their_own_table(tables, store))


async def _writes_read_their_own_table(tables: Tables, store: PostgresServingStore) -> None:
    await run(tables, "CREATE TABLE own (id int4 PRIMARY KEY, r float4, at timestamptz, c char(3))")
    await run(tables, "INSERT INTO own VALUES (1, 1.1, '2024-01-01 23:30:00+00', 'ab')")
    # not applied yet: INSERT ... SELECT of the table itself reads its overlay (the DuckDB path reads the store)
    await run(tables, "INSERT INTO own SELECT id + 1, r * 3, at, c || 'x' FROM own")
    session = new_session()
    session.variables["timezone"] = "Asia/Tokyo"
    result = await run(tables, "UPDATE own SET c = to_char(at, 'DD') WHERE id = 1 RETURNING c", session=session)
    assert isinstance(result, SendingRows) and result.rows == [("02 ",)]  # in the session's TimeZone
    table = table_of(tables, "own")
    apply(store, tables, table)
    with store.pool.connection() as conn:
        conn.execute("CREATE TEMPORARY TABLE plain (id int4 PRIMARY KEY, r float4, at timestamptz, c char(3))")
        conn.execute("INSERT INTO plain VALUES (1, 1.1, '2024-01-01 23:30:00+00', 'ab')")
        conn.execute("INSERT INTO plain SELECT id + 1, r * 3, at, c || 'x' FROM plain")
        conn.execute("UPDATE plain SET c = '02' WHERE id = 1")
        ours = conn.execute("SELECT (own.*)::text FROM own ORDER BY id").fetchall()
        assert ours == conn.execute("SELECT (plain.*)::text FROM plain ORDER BY id").fetchall()
    assert ours[1][0].startswith("(2,3.3000002,")  # real * integer is real arithmetic (float8 would give 3.3)


def test_insert_defaults_and_short_rows_as_postgresql(store: PostgresServingStore, tmp_path: Path) -> None:
    drive(store, tmp_path, lambda tables: _insert_defaults(tables, store))


async def _insert_defaults(tables: Tables, store: PostgresServingStore) -> None:
    await run(tables, "CREATE TABLE dflt (id int4 PRIMARY KEY, n int4 DEFAULT 7, v text DEFAULT 'none', "
                      "day date DEFAULT current_date)")
    await run(tables, "INSERT INTO dflt SELECT 1 + 0")  # fewer columns than the table: the rest take DEFAULT
    await run(tables, "INSERT INTO dflt VALUES (1 + 1, DEFAULT, upper('x'))")
    await run(tables, "INSERT INTO dflt (v, id) VALUES (lower('Y'), 2 + 1)")
    with pytest.raises(HeadraceError) as caught:
        await run(tables, "INSERT INTO dflt SELECT 4, 1, 'a', current_date, 5")
    assert (caught.value.sqlstate, caught.value.message) == ("42601",
                                                             "INSERT has more expressions than target columns")
    apply(store, tables, table_of(tables, "dflt"))
    assert query(store, "SELECT id, n, v, day = current_date FROM dflt ORDER BY id") == [
        (1, 7, "none", True), (2, 7, "X", True), (3, 7, "y", True)]


def test_tables_without_a_key_and_transaction_blocks(store: PostgresServingStore, tmp_path: Path) -> None:
    drive(store, tmp_path, lambda tables: _without_a_key(tables, store))


async def _without_a_key(tables: Tables, store: PostgresServingStore) -> None:
    await run(tables, "CREATE TABLE events (kind text, n int4)")
    await run(tables, "INSERT INTO events VALUES ('a', 1), ('a', 1), ('b', 2)")
    table = table_of(tables, "events")
    apply(store, tables, table)
    assert await run(tables, "UPDATE events SET n = n + 10 WHERE kind = 'a'") == CommandComplete("UPDATE 2")
    assert await run(tables, "DELETE FROM events WHERE n = 2") == CommandComplete("DELETE 1")
    await run(tables, "INSERT INTO events SELECT kind || kind, n * 2 FROM events WHERE n > 10")
    apply(store, tables, table)
    assert query(store, "SELECT kind, n FROM events ORDER BY kind, n") == [
        ("a", 11), ("a", 11), ("aa", 22), ("aa", 22)]
    assert query(store, "SELECT count(DISTINCT hr_row_id) FROM headrace_internal.table_" + table.id) == [(4,)]
    # a block: its writes stay in the session until COMMIT; first committer wins on a row both changed
    block, other = new_session(), new_session()
    block.begin()
    assert await run(tables, "UPDATE events SET n = n + 1 WHERE kind = 'aa'", session=block) == CommandComplete(
        "UPDATE 2")
    await run(tables, "UPDATE events SET n = 0 WHERE kind = 'a'", session=block)
    await run(tables, "UPDATE events SET n = -1 WHERE kind = 'aa'", session=other)  # autocommit: first
    with pytest.raises(HeadraceError) as caught:
        await tables.end_transaction(block, committed=True)
    assert caught.value.sqlstate == "40001"
    block.begin()
    await run(tables, "UPDATE events SET n = n * 3 WHERE kind = 'a'", session=block)
    await tables.end_transaction(block, committed=True)
    apply(store, tables, table)
    assert query(store, "SELECT kind, n FROM events ORDER BY kind, n") == [
        ("a", 33), ("a", 33), ("aa", -1), ("aa", -1)]


def test_create_table_over_a_relation_only_the_store_has(store: PostgresServingStore, tmp_path: Path) -> None:
    drive(store, tmp_path, lambda tables: _create_over_store_relation(tables, store))


async def _create_over_store_relation(tables: Tables, store: PostgresServingStore) -> None:
    with store.pool.connection() as conn:
        conn.execute("CREATE TABLE public.taken (x int)")
        conn.commit()
    with pytest.raises(HeadraceError) as caught:
        await run(tables, "CREATE TABLE taken (id int4 PRIMARY KEY)")
    assert (caught.value.sqlstate, caught.value.message) == ("42P07", 'relation "taken" already exists')
    result = await run(tables, "CREATE TABLE IF NOT EXISTS taken (id int4 PRIMARY KEY)")
    assert result == CommandComplete("CREATE TABLE", ('relation "taken" already exists, skipping',))
    assert tables.catalog.find_table("public", "taken") is None


def test_a_restart_repairs_the_public_table(store: PostgresServingStore, tmp_path: Path) -> None:
    """At start each table's public relation is made again if missing, or replaced when it is a view (the layout of
    an older data directory) and filled from the storage; triggers keep it current afterwards."""
    drive(store, tmp_path, lambda tables: _fill(tables, store))
    with store.pool.connection() as conn:
        conn.execute("DROP TABLE public.keep")
        storage = conn.execute("SELECT 'headrace_internal.' || quote_ident(relname) FROM pg_class WHERE relname "
                               "LIKE 'table_%%' AND relkind = 'r'").fetchone()
        assert storage is not None
        conn.execute(f"CREATE VIEW public.keep AS SELECT id, CAST(v AS varchar(4)) AS v FROM {storage[0]}")
        conn.commit()
    drive(store, tmp_path, lambda tables: _after_restart(tables, store))


async def _fill(tables: Tables, store: PostgresServingStore) -> None:
    await run(tables, "CREATE TABLE keep (id int4 PRIMARY KEY, v varchar(4))")
    await run(tables, "INSERT INTO keep VALUES (1, 'a'), (2, 'b')")
    apply(store, tables, table_of(tables, "keep"))


async def _after_restart(tables: Tables, store: PostgresServingStore) -> None:
    assert query(store, "SELECT relkind FROM pg_class WHERE oid = 'public.keep'::regclass") == [("r",)]
    assert query(store, "SELECT id, v FROM keep ORDER BY id") == [(1, "a"), (2, "b")]
    await run(tables, "UPDATE keep SET v = v || '!' WHERE id = 2")
    await run(tables, "DELETE FROM keep WHERE id = 1")
    apply(store, tables, table_of(tables, "keep"))
    assert query(store, "SELECT id, v FROM keep ORDER BY id") == [(2, "b!")]


def test_write_queries_run_as_a_role_that_cannot_become_superuser(store: PostgresServingStore,
                                                                  tmp_path: Path) -> None:
    drive(store, tmp_path, lambda tables: _not_superuser(tables, store))


async def _not_superuser(tables: Tables, store: PostgresServingStore) -> None:
    await run(tables, "CREATE TABLE guarded (id int4 PRIMARY KEY, y text)")
    await run(tables, "INSERT INTO guarded VALUES (1, 'a'), (2, 'b')")
    result = await run(tables, "UPDATE guarded SET y = current_user || ' ' || current_setting('is_superuser') "
                               "WHERE id = 1 RETURNING y")
    assert isinstance(result, SendingRows) and result.rows == [("headrace_table_writes off",)]
    with pytest.raises(HeadraceError) as caught:  # what SET ROLE on a superuser's connection would let through
        await run(tables, "UPDATE guarded SET y = set_config('session_authorization', 'postgres', true)")
    assert caught.value.sqlstate == "42501"
    # a setting a user expression changes for the session does not outlive its statement (DISCARD ALL after it)
    await run(tables, "UPDATE guarded SET y = set_config('search_path', 'nowhere', false) WHERE id = 2")
    result = await run(tables, "UPDATE guarded SET y = current_setting('search_path') WHERE id = 2 RETURNING y")
    assert isinstance(result, SendingRows) and result.rows == [('"$user", public',)]


def test_a_write_query_is_one_statement(store: PostgresServingStore) -> None:
    """Even without parameters, a write's query goes by the extended protocol: a second statement is refused."""
    column = TableColumn("a", "int4")
    assert on_postgres.run_insert_query(store, "SELECT 1", [], [column], {}) == [(1,)]
    with pytest.raises(HeadraceError) as caught:  # as a simple Query both would run, answering [(1,)]
        on_postgres.run_insert_query(store, "SELECT 1", [], [column], {}, with_clause="SELECT 2;")
    assert (caught.value.sqlstate, caught.value.message) == ("42601", "cannot insert multiple commands into a "
                                                                      "prepared statement")
    on_postgres.close_write_pool(store)


def test_times_of_any_year_and_infinity_round_trip(store: PostgresServingStore, tmp_path: Path) -> None:
    drive(store, tmp_path, lambda tables: _times_of_any_year_and_infinity_round_trip(tables, store))


async def _times_of_any_year_and_infinity_round_trip(tables: Tables, store: PostgresServingStore) -> None:
    """Literals PostgreSQL reads ('epoch', BC, year 10000, +-infinity) through the log, the overlay (an UPDATE
    reads them back) and the serving driver's COPY, stored as PostgreSQL's own INSERT stores them."""
    await run(tables, "CREATE TABLE times (id int4 PRIMARY KEY, d timestamp, z timestamptz, a date)")
    values = ("(1, 'epoch', 'epoch', 'epoch'), (2, 'infinity', 'infinity', 'infinity'), "
              "(3, '-infinity', '-infinity', '-infinity'), "
              "(4, 'Feb 16 17:32:01 0097 BC', 'Feb 16 17:32:01 0097 BC', 'Feb 16 0097 BC'), "
              "(5, 'Sat Mar 12 23:58:48 10000', 'Sat Mar 12 23:58:48 10000 IST', '10000-03-12')")
    await run(tables, f"INSERT INTO times VALUES {values}")
    update = "UPDATE times SET id = id * 10 WHERE d = 'infinity' OR a < '0001-01-01' OR z > '9999-12-31'"
    assert await run(tables, update) == CommandComplete("UPDATE 4")  # unapplied: through the overlay
    apply(store, tables, table_of(tables, "times"))
    assert await run(tables, "DELETE FROM times WHERE z = '-infinity'") == CommandComplete("DELETE 1")
    apply(store, tables, table_of(tables, "times"))
    with store.pool.connection() as conn:
        conn.execute("SET TimeZone = 'UTC'")
        conn.execute("CREATE TEMPORARY TABLE plain_times (id int4 PRIMARY KEY, d timestamp, z timestamptz, a date)")
        conn.execute(f"INSERT INTO plain_times VALUES {values}")
        conn.execute(update.replace("times", "plain_times"))
        conn.execute("DELETE FROM plain_times WHERE z = '-infinity'")
        ours = conn.execute("SELECT id, d::text, z::text, a::text FROM public.times ORDER BY id").fetchall()
        theirs = conn.execute("SELECT id, d::text, z::text, a::text FROM plain_times ORDER BY id").fetchall()
    assert ours == theirs and len(ours) == 4
    assert ours[1] == (20, "infinity", "infinity", "infinity")


def test_joins_truncate_and_multiple_column_set(store: PostgresServingStore, tmp_path: Path) -> None:
    drive(store, tmp_path, lambda tables: _joins_truncate_and_multiple_column_set(tables, store))


async def _joins_truncate_and_multiple_column_set(tables: Tables, store: PostgresServingStore) -> None:
    await run(tables, "CREATE TABLE u (a int4, b int4 DEFAULT 7, c text)")
    await run(tables, "INSERT INTO u VALUES (5, 10, 'foo'), (10, 15, NULL)")
    assert await run(tables, "UPDATE u SET a = v.i FROM (VALUES (100, 10)) AS v(i, j) WHERE u.b = v.j") == \
        CommandComplete("UPDATE 1")
    # a row two joined rows match is updated once
    assert await run(tables, "UPDATE u SET c = 'x' FROM (VALUES (1), (2)) AS w(n) WHERE u.a = 10") == \
        CommandComplete("UPDATE 1")
    assert await run(tables, "UPDATE u SET (c, b) = ('car', a + b), a = a + 1 WHERE a = 10") == \
        CommandComplete("UPDATE 1")
    assert await run(tables, "UPDATE u SET (b, a) = (SELECT b, a FROM u WHERE c = 'car') WHERE a = 100") == \
        CommandComplete("UPDATE 1")
    assert await run(tables, "UPDATE u SET (a, b) = ROW(DEFAULT, DEFAULT) WHERE c = 'car'") == \
        CommandComplete("UPDATE 1")
    apply(store, tables, table_of(tables, "u"))
    assert sorted(query(store, "SELECT a, b, c FROM public.u"), key=str) == sorted([(None, 7, "car"), (11, 25, "foo")],
                                                                                 key=str)
    for statement, sqlstate in (("UPDATE u SET (a, b) = (SELECT 1)", "42601"),
                                ("UPDATE u SET (a, b) = (1)", "0A000"),
                                ("INSERT INTO u (a, b, c) VALUES (1, 2)", "42601"),
                                ("INSERT INTO u (a, b) SELECT 1", "42601")):
        with pytest.raises(HeadraceError) as caught:
            await run(tables, statement)
        assert caught.value.sqlstate == sqlstate, statement
    assert await run(tables, "DELETE FROM u USING (VALUES ('car')) AS k(c) WHERE u.c = k.c") == \
        CommandComplete("DELETE 1")
    assert await run(tables, "TRUNCATE u") == CommandComplete("TRUNCATE TABLE")
    apply(store, tables, table_of(tables, "u"))
    assert query(store, "SELECT count(*) FROM public.u") == [(0,)]


def test_the_write_role_reads_headraces_relations_only(store: PostgresServingStore) -> None:
    """A table a user made in public (the store's own, owned by that user) is not readable by the role write
    queries run as: a write could otherwise copy it into a headrace table by a name headrace does not see."""
    from headrace.store.table_reads_postgres import WRITE_ROLE, close_write_pool, ensure_write_role

    with store.pool.connection() as conn:
        for role in ("hr_test_table_owner", WRITE_ROLE):  # roles are the cluster's: maybe made by another test
            conn.execute(f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') "
                         f"THEN CREATE ROLE {role}; END IF; END $$")
        conn.execute("CREATE TABLE public.users_own (secret text)")
        conn.execute("ALTER TABLE public.users_own OWNER TO hr_test_table_owner")
        conn.execute(f"GRANT SELECT ON public.users_own TO {WRITE_ROLE}")  # as an earlier version granted
        conn.execute("CREATE TABLE headrace_internal.headraces_own (k int)")
        conn.commit()
    ensure_write_role(store)
    try:
        with store.pool.connection() as conn:
            allowed = conn.execute(
                "SELECT has_table_privilege(%s, 'public.users_own', 'SELECT'), "
                "has_table_privilege(%s, 'headrace_internal.headraces_own', 'SELECT')", [WRITE_ROLE, WRITE_ROLE]).fetchone()
        assert allowed == (False, True)
    finally:
        close_write_pool(store)


def test_a_block_reads_its_own_writes_of_every_type(store: PostgresServingStore, tmp_path: Path) -> None:
    drive(store, tmp_path, lambda tables: _a_block_reads_its_own_writes(tables, store))


async def _a_block_reads_its_own_writes(tables: Tables, store: PostgresServingStore) -> None:
    """A read in a block that wrote the table (coordinator/table_own_reads.py): its text, run by PostgreSQL,
    gives what the same statements give inside a PostgreSQL transaction: every type through the overlay's
    literals, stored rows the block updated or deleted, acknowledged rows not yet applied, the client's $1."""
    await run(tables, TYPES_TABLE)
    stored = ("(1, 7, -8, 1.1, 0.1, 'x''s', 'abc', 'ab', true, '2024-05-01 12:00:00+02', '[1, {\"a\": 2}]', "
              "'{\"b\": 1, \"a\": [true]}', '\\x00ff', 1.005, 2.5, '2024-02-29', '2024-02-29 23:59:59.123456', "
              "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', '1 day 02:03:04.5')")
    statements = [f"INSERT INTO kinds VALUES {stored}", "INSERT INTO kinds (id, t) VALUES (2, 'applied'), (3, 'c')"]
    block_statements = ["INSERT INTO kinds (id, r, t, jb, c) VALUES (4, 1.5, E'back\\\\slash', '[\"q''\"]', 'é')",
                        "UPDATE kinds SET s = s + 1, t = t || '!' WHERE id = 1", "DELETE FROM kinds WHERE id = 3"]
    await run(tables, statements[0])
    apply(store, tables, table_of(tables, "kinds"))
    await run(tables, statements[1])  # acknowledged, not applied: the overlay has it
    block = new_session()
    block.begin()
    for sql in block_statements:
        await run(tables, sql, session=block)
    read = "SELECT id, (s, i, r, d, t, v, c, b, ts, jb, by, n, day, at, u)::text FROM kinds WHERE id <> $1 ORDER BY id"
    own = await tables.statement_with_own_writes(block, parse_statement(read), read)
    assert own is not None and own[1] == {table_of(tables, "kinds").id}
    rewritten = own[0]
    assert "$1" in rewritten
    with store.pool.connection() as conn:
        conn.execute("CREATE TEMPORARY TABLE plain_kinds " + TYPES_TABLE.removeprefix("CREATE TABLE kinds"))
        for sql in [*statements, *block_statements]:
            conn.execute(sql.replace("kinds", "plain_kinds"))
        ours = conn.execute(rewritten.replace("$1", "%s"), [2]).fetchall()
        theirs = conn.execute(read.replace("kinds", "plain_kinds").replace("$1", "%s"), [2]).fetchall()
    assert [row[0] for row in ours] == [1, 4]
    assert ours == theirs
    # what cannot see the block's writes is refused: a table keyed by hidden row ids, a statement no query
    await run(tables, "CREATE TABLE loose (a int4)")
    await run(tables, "INSERT INTO loose VALUES (1)", session=block)
    for sql in ("SELECT a FROM loose", "CREATE VIEW v AS SELECT id FROM kinds"):
        with pytest.raises(HeadraceError) as caught:
            await tables.statement_with_own_writes(block, parse_statement(sql), sql)
        assert caught.value.sqlstate == "25000"
    assert await tables.statement_with_own_writes(block, parse_statement("SELECT 1"), "SELECT 1") is None


def test_a_read_waiting_for_a_table_dropped_meanwhile_ends(store: PostgresServingStore, tmp_path: Path) -> None:
    drive(store, tmp_path, _a_read_waiting_for_a_dropped_table)


async def _a_read_waiting_for_a_dropped_table(tables: Tables) -> None:
    """A read waits for the pipeline to apply a table's acknowledged writes; a DROP TABLE meanwhile ends the
    wait (the read then finds no such relation), never an internal error when the wait times out."""
    await run(tables, "CREATE TABLE waited (id int PRIMARY KEY)")
    await run(tables, "INSERT INTO waited VALUES (1)")  # acknowledged, never applied: no pipeline runs here
    waiting = asyncio.create_task(tables.wait_visible("SELECT * FROM waited", timeout_s=30))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await run(tables, "DROP TABLE waited")
    await asyncio.wait_for(waiting, 5)
