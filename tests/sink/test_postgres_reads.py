"""Sinks over the PostgreSQL serving store (sink/postgres_reads.py) on a real PostgreSQL 15 (the shared test cluster):
the column types PostgreSQL describes, the Arrow tables the drivers get (the DuckDB store's types for the same
columns), a view's sink input in PostgreSQL's dialect (the same columns as on DuckDB; its rows PostgreSQL's own
answer for the view), and a sink end to end: a SinkRunner thread driving the POSTGRES driver into another database
of the cluster, and the PARQUET driver into a directory, across a restart, ending exactly equal to the input."""

from __future__ import annotations

import base64
import datetime
import itertools
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from headrace.catalog.sinks import Sink
from headrace.errors import HeadraceError
from headrace.materialize.drivers.builtin import BUILTIN_DRIVERS
from headrace.materialize.drivers.postgres_serving import PostgresServingTransactor
from headrace.materialize.drivers.serving import ServingTransactor
from headrace.materialize.hosting import ThreadedDriverServer
from headrace.materialize.protocol import Binding, MaterializationSpec, Open, Store
from headrace.sink.changes import ChangeReader
from headrace.sink.configs import Endpoint
from headrace.sink.inputs import SinkInput, SinkStore, _view_input
from headrace.sink.postgres_reads import arrow_read, describe
from headrace.sink.runner import SinkRunner, sink_spec
from headrace.sql.parser import parse_statement
from headrace.sql.view_serving import public_relation_sql, view_binding, view_materialization
from headrace.sql.views import InputRelation, ViewPlan, compile_view
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import ServingStore

from ..real_servers.postgres import new_store_database
from .test_changes import FULL_KEY_RANGE, SERVING_STORES, new_store

_names = itertools.count()

# Every column type a table can have, in the protocol's row-path conventions (shared contract).
TYPED_COLUMNS = {"k": "BIGINT", "note": "VARCHAR", "body": "JSON", "at": "TIMESTAMPTZ", "n": "INTEGER",
                 "x": "DOUBLE", "ok": "BOOLEAN", "raw": "BLOB", "price": "DECIMAL(10,2)", "day": "DATE",
                 "local": "TIMESTAMP", "u": "UUID", "span": "INTERVAL"}
AT = 1_700_000_000_123_456  # µs since the epoch
U = "7d444840-9dc0-11d1-b245-5ffdce74fad2"


def typed_values(k: int, note: str | None = "a'b\"c,\n", amount: int = 1) -> list[Any]:
    return [note, {"customer": f"c{k}", "amount": amount, "tags": ["x", None]}, AT + k, -k, 0.1 * k, k % 2 == 0,
            base64.b64encode(bytes([0, k % 256, 10, 44])).decode(), f"{k}.{amount % 100:02d}", "2024-02-29",
            AT + 1, U, 90_061_000_001]


def expected_arrow(k: int, note: str | None = "a'b\"c,\n", amount: int = 1) -> dict[str, Any]:
    """What the Arrow table holds for typed_values(k, note, amount): the DuckDB store's Python values."""
    return {"k": k, "note": note, "body": f'{{"tags": ["x", null], "amount": {amount}, "customer": "c{k}"}}',
            "at": datetime.datetime(2023, 11, 14, 22, 13, 20, 123456 + k, tzinfo=datetime.timezone.utc),
            "n": -k, "x": 0.1 * k, "ok": k % 2 == 0, "raw": bytes([0, k % 256, 10, 44]),
            "price": Decimal(f"{k}.{amount % 100:02d}"), "day": datetime.date(2024, 2, 29),
            "local": datetime.datetime(2023, 11, 14, 22, 13, 20, 123457), "u": U,
            "span": 90_061_000_001}


ARROW_TYPES = {"k": pa.int64(), "note": pa.string(), "body": pa.string(), "at": pa.timestamp("us", tz="UTC"),
               "n": pa.int32(), "x": pa.float64(), "ok": pa.bool_(), "raw": pa.binary(),
               "price": pa.decimal128(10, 2), "day": pa.date32(), "local": pa.timestamp("us"), "u": pa.string(),
               "span": pa.int64()}  # INTERVAL: the protocol's microseconds


class TypedRelation:
    """A table-like relation with every column type, in a PostgresServingStore, written by its serving driver."""

    def __init__(self, store: PostgresServingStore) -> None:
        self.store = store
        self.name = f"typed_{next(_names)}"
        names = list(TYPED_COLUMNS)
        self.binding = Binding(("headrace_internal", self.name), ("k",), tuple(names[1:]), dict(TYPED_COLUMNS))
        store.apply(self.binding)
        self._transactor = PostgresServingTransactor(store)
        self._transactor.open(Open(MaterializationSpec(self.name, (self.binding,)), *FULL_KEY_RANGE))
        columns = ", ".join(f'"{name}"' for name in reversed(names))  # key last: columns() puts it first
        self.input = SinkInput("table", f"public.{self.name}", self.binding.resource_path, self.name,
                               f"SELECT hr_timestamp, hr_diff, {columns} FROM __hr_input", ("k",))
        self.held: set[int] = set()

    def commit(self, puts: dict[int, list[Any]], deletes: tuple[int, ...] = ()) -> int:
        stores = [Store(0, [k], values, None, exists=k in self.held) for k, values in puts.items()]
        stores += [Store(0, [k], [], None, exists=True, delete=True) for k in deletes]
        self._transactor.store(stores)
        self._transactor.start_commit({})
        self.held = (self.held | set(puts)) - set(deletes)
        latest = self.store.latest_timestamp(self.name)
        assert latest is not None
        return latest

    def close(self) -> None:
        self._transactor.close()


@pytest.fixture
def store() -> Iterator[PostgresServingStore]:
    serving = PostgresServingStore(new_store_database("sinkpg"))
    yield serving
    serving.close()


@pytest.fixture
def typed(store: PostgresServingStore) -> Iterator[TypedRelation]:
    relation = TypedRelation(store)
    yield relation
    relation.close()


# ------------------------------------------------------------------------------------------------ types


def test_postgresql_s_types_are_described_by_their_canonical_names(store: PostgresServingStore) -> None:
    sql = ("SELECT 1::int2 a, 1::int4 b, 1::int8 c, 1::float4 d, 1::float8 e, 1::numeric(12,3) f, 1::numeric g, "
           "'x'::text h, 'x'::varchar(3) i, 'x'::char(3) j, '{}'::json k, '{}'::jsonb l, now() m, "
           "now()::timestamp n, current_date o, interval '1 day' p, gen_random_uuid() q, '\\x00'::bytea r, true s, "
           "ARRAY[1] t, ARRAY[1::numeric(5,1)] v, ARRAY['x'] w, now()::time x, 'x'::name y LIMIT 0")
    assert describe(store, sql) == [
        ("a", "SMALLINT"), ("b", "INTEGER"), ("c", "BIGINT"), ("d", "FLOAT"), ("e", "DOUBLE"),
        ("f", "DECIMAL(12,3)"), ("g", "DOUBLE"), ("h", "VARCHAR"), ("i", "VARCHAR"), ("j", "VARCHAR"),
        ("k", "JSON"), ("l", "JSON"), ("m", "TIMESTAMPTZ"), ("n", "TIMESTAMP"), ("o", "DATE"), ("p", "INTERVAL"),
        ("q", "UUID"), ("r", "BLOB"), ("s", "BOOLEAN"), ("t", "INTEGER[]"), ("v", "DECIMAL(5,1)[]"),
        ("w", "VARCHAR[]"), ("x", "TIME"), ("y", "VARCHAR")]


def test_types_no_driver_holds_are_read_as_text_until_a_driver_refuses_them() -> None:
    """The reader is made before the driver's Validate (CREATE SINK) refuses a type: it must not fail first."""
    for type_name in ("DECIMAL(50,2)", "INTEGER[]", "TIME"):
        read = arrow_read(type_name, "c.x")
        assert (read.select, read.parse_type) == ("(c.x)::text", pa.string())
    assert arrow_read("DECIMAL(38,4)", "c.x").parse_type == pa.decimal128(38, 4)


def test_a_select_postgresql_refuses_is_an_error_with_its_sqlstate(store: PostgresServingStore) -> None:
    with pytest.raises(HeadraceError, match='column "nosuch" does not exist') as raised:
        describe(store, "SELECT nosuch LIMIT 0")
    assert raised.value.sqlstate == "42703"


def test_every_column_type_reaches_arrow_as_the_drivers_take_it(typed: TypedRelation) -> None:
    """Snapshot, keyed changes and delta changes: the Arrow types of the DuckDB path (timestamptz as
    timestamp[us, UTC], decimal128, JSON as its text) and the values exactly, NULLs and an empty string too."""
    columns = typed.input.columns(typed.store)
    assert columns == [(name, type_name) for name, type_name in TYPED_COLUMNS.items() if name == "k"] + \
        [(name, TYPED_COLUMNS[name]) for name in reversed(list(TYPED_COLUMNS)) if name != "k"]
    first = typed.commit({1: typed_values(1), 2: typed_values(2, note=""), 3: [None] * 12})
    second = typed.commit({2: typed_values(2, note="", amount=7), 4: typed_values(4)}, deletes=(1,))
    names = [name for name, _ in columns]
    schema = pa.schema([(name, ARROW_TYPES[name]) for name in names])
    null_row = {name: (3 if name == "k" else None) for name in names}

    snapshot = ChangeReader(typed.store, typed.input, columns, False).next_batch(None, snapshot_at=first)
    assert snapshot is not None and snapshot.rows is not None and snapshot.upto == first
    assert snapshot.rows.schema == schema
    assert sorted(snapshot.rows.to_pylist(), key=lambda row: row["k"]) == [
        expected_arrow(1), expected_arrow(2, note=""), null_row]

    keyed = ChangeReader(typed.store, typed.input, columns, False).next_batch(first)
    assert keyed is not None and (keyed.after, keyed.upto, keyed.changes) == (first, second, 4)
    assert keyed.rows is not None and keyed.updated is not None and keyed.deleted is not None
    assert keyed.rows.schema == schema and keyed.updated.schema == schema
    assert keyed.rows.to_pylist() == [expected_arrow(4)]
    assert keyed.updated.to_pylist() == [expected_arrow(2, note="", amount=7)]
    assert keyed.deleted.schema == pa.schema([("k", pa.int64())]) and keyed.deleted.to_pylist() == [{"k": 1}]

    deltas = ChangeReader(typed.store, typed.input, columns, True)
    delta = deltas.next_batch(first)
    assert delta is not None and delta.delta is not None
    assert delta.delta.schema == pa.schema([("hr_timestamp", pa.int64()), ("hr_diff", pa.int32()), *schema])
    assert delta.delta.to_pylist() == [
        {"hr_timestamp": second, "hr_diff": -1, **expected_arrow(1)},
        {"hr_timestamp": second, "hr_diff": -1, **expected_arrow(2, note="")},
        {"hr_timestamp": second, "hr_diff": 1, **expected_arrow(2, note="", amount=7)},
        {"hr_timestamp": second, "hr_diff": 1, **expected_arrow(4)}]

    # Rows stored again unchanged (every type equal to itself, NULLs too) cancel out; a changed one does not.
    third = typed.commit({3: [None] * 12, 4: typed_values(4), 2: typed_values(2, note=None, amount=7)})
    rewritten = deltas.next_batch(second)
    assert rewritten is not None and rewritten.changes == 6 and rewritten.delta is not None
    assert rewritten.delta.to_pylist() == [
        {"hr_timestamp": third, "hr_diff": -1, **expected_arrow(2, note="", amount=7)},
        {"hr_timestamp": third, "hr_diff": 1, **expected_arrow(2, note=None, amount=7)}]


def test_delta_consolidation_of_a_key_changed_twice_one_way_is_postgresql_s_group_by(
        typed: TypedRelation) -> None:
    """Arrow consolidates a keyed input's changes; an input whose key repeats within a commit (here every row
    under one key) is consolidated by PostgreSQL's GROUP BY instead, with the same result GROUP BY gives."""
    columns = [("k", "BIGINT"), ("note", "VARCHAR")]
    one_key = SinkInput("table", "public.one_key", typed.input.resource_path, typed.input.materialization,
                        "SELECT hr_timestamp, hr_diff, 1::bigint AS k, note FROM __hr_input", ("k",))
    first = typed.commit({1: typed_values(1, note="x"), 2: typed_values(2, note="x"), 3: typed_values(3, "y")})
    second = typed.commit({1: typed_values(1, note="z"), 2: typed_values(2, note="x", amount=5)})
    batch = ChangeReader(typed.store, one_key, columns, True).next_batch(0)
    assert batch is not None and batch.delta is not None
    assert batch.delta.to_pylist() == [
        {"hr_timestamp": first, "hr_diff": 1, "k": 1, "note": "y"},  # by commit, key, then the diff
        {"hr_timestamp": first, "hr_diff": 2, "k": 1, "note": "x"},
        {"hr_timestamp": second, "hr_diff": -1, "k": 1, "note": "x"},  # key 2's -1/+1 of "x" cancel
        {"hr_timestamp": second, "hr_diff": 1, "k": 1, "note": "z"}]


# ------------------------------------------------------------------------------------------------ views

TABLE = InputRelation(kind="table", item_id="u1", name="t",
                      columns={"id": "int4", "g": "int2", "n": "numeric", "f": "float4", "v": "varchar",
                               "j": "jsonb", "a": "int4[]"},
                      key=("id",), append_only=False)


def view_plan(select: str) -> ViewPlan:
    return compile_view(parse_statement(f"CREATE MATERIALIZED VIEW v AS {select}"),  # type: ignore[arg-type]
                        lambda schema, name: TABLE if name == "t" else None)


def write_view(store: SinkStore, plan: ViewPlan, view_id: str, documents: dict[str, list[Any]]) -> int:
    """Apply the view's table and commit {hr_key: stored values} through the store's serving driver."""
    binding = view_binding(plan, view_id)
    store.apply(binding)
    transactor = ServingTransactor(store) if isinstance(store, ServingStore) else PostgresServingTransactor(store)
    try:
        transactor.open(Open(view_materialization(plan, view_id), *FULL_KEY_RANGE))
        transactor.store([Store(0, [key], values, None, exists=False) for key, values in documents.items()])
        transactor.start_commit({})
    finally:
        transactor.close()
    latest = store.latest_timestamp(f"view_{view_id}")
    assert latest is not None
    return latest


@pytest.mark.parametrize("kind", SERVING_STORES)
def test_a_views_sink_columns_are_the_same_on_both_stores(kind: str, tmp_path: Path) -> None:
    serving = new_store(kind, tmp_path)
    try:
        plan = view_plan("SELECT id, g, n, f, v, j, a FROM t")
        view_id = f"cols{next(_names)}"
        write_view(serving, plan, view_id, {})
        sink_input = _view_input(plan, view_id, "public.v", f"view_{view_id}", serving.dialect)
        assert sink_input.key == ("hr_key",)
        # a view's unconstrained numeric: exact on DuckDB since views keep numeric exact (its DECIMAL(38,16)
        # column); the PostgreSQL store's sinks still read it as float8 (sink/postgres_reads.py canonical_type)
        numeric = "DECIMAL(38,16)" if kind == "duckdb" else "DOUBLE"
        assert sink_input.columns(serving) == [
            ("hr_key", "VARCHAR"), ("id", "INTEGER"), ("g", "SMALLINT"), ("n", numeric), ("f", "FLOAT"),
            ("v", "VARCHAR"), ("j", "JSON"), ("a", "INTEGER[]")]
        grouped = view_plan("SELECT g, count(*) AS c, sum(id) AS total FROM t GROUP BY g")
        grouped_id = f"cols{next(_names)}"
        write_view(serving, grouped, grouped_id, {})
        grouped_input = _view_input(grouped, grouped_id, "public.v", f"view_{grouped_id}", serving.dialect)
        assert grouped_input.key == ("g",)
        assert grouped_input.columns(serving) == [("g", "SMALLINT"), ("c", "BIGINT"), ("total", "BIGINT")]
    finally:
        serving.close()


def test_a_views_snapshot_and_changes_are_postgresql_s_answer_for_the_view(store: PostgresServingStore) -> None:
    """The view's SELECT list runs in PostgreSQL (integer division, numeric, casts back to the view's types): the
    sink's rows equal what PostgreSQL's public relation of the view shows, at the snapshot and after a change."""
    plan = view_plan("SELECT g, sum(id) / count(*) AS mean, count(*) AS c, max(v) AS top FROM t GROUP BY g "
                     "HAVING count(*) > 1")
    view_id = f"agg{next(_names)}"
    field_values = {"sum": lambda n: 7 * n, "count_star": lambda n: 2 * n, "max": lambda n: f"v{n}"}

    def stored(group: int, n: int) -> list[Any]:
        """The stored fields: k0, an aggregate's value per a*, no reduction state (hr_state: the sink never reads
        it)."""
        values = {"k0": group, **{a.field: field_values[a.function](n) for a in plan.aggregates}}
        return [values.get(name) for name in plan.stored_fields]

    assert plan.stored_fields[0] == "k0" and {a.function for a in plan.aggregates} <= set(field_values)
    first = write_view(store, plan, view_id, {"[1]": stored(1, 1), "[2]": stored(2, 2), "[3]": stored(3, 0)})
    with psycopg.connect(store.conninfo, autocommit=True) as conn:
        conn.execute(public_relation_sql(plan, view_id, dialect="postgres"))
        answer = conn.execute("SELECT g, mean, c, top FROM public.v ORDER BY g").fetchall()
    assert answer == [(1, 3, 2, "v1"), (2, 3, 4, "v2")]  # 7 / 2 = 3 and 14 / 4 = 3: integer division; g=3 HAVING'd
    sink_input = _view_input(plan, view_id, "public.v", f"view_{view_id}", store.dialect)
    columns = sink_input.columns(store)
    assert columns == [("g", "SMALLINT"), ("mean", "BIGINT"), ("c", "BIGINT"), ("top", "VARCHAR")]
    reader = ChangeReader(store, sink_input, columns, False)
    snapshot = reader.next_batch(None)
    assert snapshot is not None and snapshot.rows is not None and snapshot.upto == first
    assert sorted(tuple(row.values()) for row in snapshot.rows.to_pylist()) == answer

    transactor = PostgresServingTransactor(store)
    transactor.open(Open(view_materialization(plan, view_id), *FULL_KEY_RANGE))
    transactor.store([Store(0, ["[1]"], stored(1, 3), None, exists=True),  # 21 / 6 = 3, v3
                      Store(0, ["[3]"], stored(3, 1), None, exists=True),  # now passes HAVING: new to the target
                      Store(0, ["[2]"], [], None, exists=True, delete=True)])
    transactor.start_commit({})
    transactor.close()
    batch = reader.next_batch(snapshot.upto)
    assert batch is not None and batch.rows is not None and batch.updated is not None and batch.deleted is not None
    assert batch.rows.to_pylist() == [{"g": 3, "mean": 3, "c": 2, "top": "v1"}]
    assert batch.updated.to_pylist() == [{"g": 1, "mean": 3, "c": 6, "top": "v3"}]
    assert batch.deleted.to_pylist() == [{"g": 2}]


# ------------------------------------------------------------------------------------------------ end to end


def a_sink(driver: str, delta_updates: bool = False) -> Sink:
    number = next(_names)
    return Sink(id=f"e2e{number}", name=f"out_{number}", relation_schema="public", relation_name="typed",
                driver=driver, options={}, create_sql=f"CREATE SINK ... INTO {driver.upper()} (...)",
                delta_updates=delta_updates)


def wait_for(runner: SinkRunner, position: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    runner.wake()
    while runner.status.position != position:
        assert time.monotonic() < deadline, f"the sink stayed at {runner.status.position} ({runner.status})"
        time.sleep(0.05)


TEXT_COLUMNS = ", ".join(f'"{name}"::text' for name in TYPED_COLUMNS)


def rows_as_text(conninfo: str, table: str) -> list[tuple[Any, ...]]:
    """The rows as PostgreSQL prints them (UTC), ordered by key: two tables compare exactly, value by value."""
    with psycopg.connect(conninfo) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        return conn.execute(f"SELECT {TEXT_COLUMNS} FROM {table} ORDER BY k").fetchall()


def test_a_postgres_sink_keeps_another_database_equal_to_its_input_across_a_restart(
        typed: TypedRelation, tmp_path: Path) -> None:
    """SinkRunner threads (snapshot, then pipelined change transactions; stopped and started again as after a
    restart, resuming from the checkpoint the target holds) against the POSTGRES driver: the target table is
    the input, value for value, after each step."""
    target = new_store_database("sinktarget")
    store = typed.store
    typed.commit({k: typed_values(k) for k in range(1, 6)} | {6: [None] * 12})
    builtin = BUILTIN_DRIVERS["postgres"]
    server = ThreadedDriverServer(builtin.transactor_factory, builtin.connector())
    sink = a_sink("postgres")
    endpoint = Endpoint("postgres", {"url": target}, ("public", "typed_out"))
    columns = typed.input.columns(store)
    spec = sink_spec(sink, endpoint, typed.input, columns)
    source_table = f'headrace_internal."{typed.name}"'

    def runner() -> SinkRunner:
        started = SinkRunner(sink, spec, ChangeReader(store, typed.input, columns, False, max_changes=3), store,
                             server.connect, builtin, tmp_path / "state")
        started.start()
        return started

    try:
        first = runner()
        wait_for(first, store.latest_timestamp(typed.name) or 0)
        assert rows_as_text(target, "public.typed_out") == rows_as_text(store.conninfo, source_table)
        assert len(rows_as_text(target, "public.typed_out")) == 6
        typed.commit({2: typed_values(2, amount=9), 7: typed_values(7)}, deletes=(3,))
        typed.commit({8: typed_values(8), 9: typed_values(9, note=None)})
        latest = typed.commit({2: typed_values(2, amount=10)}, deletes=(6, 8))
        wait_for(first, latest)
        assert first.status.state == "running" and first.status.last_error is None
        first.stop()
        expected = rows_as_text(store.conninfo, source_table)
        assert rows_as_text(target, "public.typed_out") == expected
        assert [row[0] for row in expected] == ["1", "2", "4", "5", "7", "9"]
        assert expected[1][2] == '{"tags": ["x", null], "amount": 10, "customer": "c2"}'

        latest = typed.commit({10: typed_values(10), 1: typed_values(1, note="back")}, deletes=(4,))
        second = runner()  # a restart: Open returns the target's checkpoint, the sink resumes after it
        wait_for(second, latest)
        second.stop()
        assert rows_as_text(target, "public.typed_out") == rows_as_text(store.conninfo, source_table)
        assert second.status.transactions >= 1 and second.status.last_error is None
    finally:
        server.stop()


def test_a_delta_parquet_sink_holds_every_change_of_its_input(typed: TypedRelation, tmp_path: Path) -> None:
    """A runner with a recovery log (PARQUET, delta updates) reading the PostgreSQL store: every change once, the
    snapshot's rows at its timestamp; the files' schema the spec's."""
    store = typed.store
    first = typed.commit({1: typed_values(1), 2: typed_values(2)})
    builtin = BUILTIN_DRIVERS["parquet"]
    server = ThreadedDriverServer(builtin.transactor_factory, builtin.connector())
    sink = a_sink("parquet", delta_updates=True)
    endpoint = Endpoint("parquet", {"path": str(tmp_path / "lake")}, ("typed_out",))
    columns = [(name, type_name) for name, type_name in typed.input.columns(store) if type_name != "INTERVAL"]
    sink_input = SinkInput("table", typed.input.relation, typed.input.resource_path, typed.input.materialization,
                           "SELECT hr_timestamp, hr_diff, " + ", ".join(f'"{n}"' for n, _ in columns)
                           + " FROM __hr_input", ("k",))  # PARQUET holds no INTERVAL
    spec = sink_spec(sink, endpoint, sink_input, columns)
    runner = SinkRunner(sink, spec, ChangeReader(store, sink_input, columns, True), store, server.connect, builtin,
                        tmp_path / "state")
    runner.start()
    try:
        wait_for(runner, first)
        second = typed.commit({2: typed_values(2, amount=5), 3: typed_values(3)}, deletes=(1,))
        wait_for(runner, second)
    finally:
        runner.stop()
        server.stop()
    written = pq.read_table(tmp_path / "lake" / "typed_out")
    assert written.schema.names == list(spec.bindings[0].columns)
    changes = sorted((row["hr_timestamp"], row["hr_diff"], row["k"], row["body"]) for row in written.to_pylist())

    def body(k: int, amount: int = 1) -> str:
        return str(expected_arrow(k, amount=amount)["body"])

    assert changes == [(first, 1, 1, body(1)), (first, 1, 2, body(2)),
                       (second, -1, 1, body(1)), (second, -1, 2, body(2)),
                       (second, 1, 2, body(2, 5)), (second, 1, 3, body(3))]
    assert {row["k"]: row["at"] for row in written.to_pylist()}[3] == expected_arrow(3)["at"]
