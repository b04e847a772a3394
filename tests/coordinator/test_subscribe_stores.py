"""SUBSCRIBE's reads (coordinator/subscribe.py) and index arrangements (store/arrangements.py) on both serving
stores, built directly: the DuckDB one and the PostgreSQL one (a fresh database of the shared test cluster). Data is
committed through each store's own serving driver (ThreadedDriverServer), as the pipeline commits it."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import pq
from psycopg.adapt import Loader
from psycopg.types.string import TextLoader
import pytest

from headrace.coordinator import subscribe
from headrace.coordinator.responses import Column
from headrace.coordinator.subscribe_postgres import (READER_MARK, READER_ROLE, describe_columns, fetch_rows, reading,
                                                     subscriber_select)
from headrace.coordinator.subscribe import (INPUT, Store, SubscribeTarget, SubscriptionStream, describe_target,
                                            output_columns, restrict, view_target)
from headrace.errors import HeadraceError
from headrace.materialize.drivers.postgres_serving import PostgresServingConnector, PostgresServingTransactor
from headrace.materialize.drivers.serving import ServingConnector, ServingTransactor
from headrace.materialize.hosting import ThreadedDriverServer
from headrace.materialize.protocol import Binding, MaterializationSpec, StoreColumns
from headrace.materialize.runtime import Runtime
from headrace.pgwire import types as pg
from headrace.sql.parser import parse_statement
from headrace.sql.view_serving import view_binding
from headrace.sql.views import InputRelation, compile_view
from headrace.store.arrangements import Arrangement
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import ChangelogCompacted, ServingStore, changelog_name, changelog_table, quote_ident
from tests.real_servers.postgres import new_store_database, shared_cluster

PATH = ("headrace_internal", "source_s1")
MATERIALIZATION = "source_s1"
TYPES = {"id": "BIGINT", "name": "VARCHAR", "doc": "JSON", "price": "DECIMAL(10,2)", "x": "DOUBLE",
         "at": "TIMESTAMPTZ"}
SPEC = MaterializationSpec(MATERIALIZATION, (Binding(PATH, ("id",), tuple(TYPES)[1:], TYPES),))
AT = datetime.datetime(2023, 11, 14, 22, 13, 20, 500000, tzinfo=datetime.timezone.utc)
_batches = itertools.count()


@pytest.fixture(params=["duckdb", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    serving: Store = (ServingStore(tmp_path / "store.duckdb") if request.param == "duckdb"
                      else PostgresServingStore(new_store_database("subscribe")))
    yield serving
    serving.close()


@pytest.fixture
def postgres_store() -> Iterator[PostgresServingStore]:
    serving = PostgresServingStore(new_store_database("subscribe"))
    yield serving
    serving.close()


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=2)
    yield pool
    pool.shutdown(wait=True)


class Committer:
    """Commits rows of SPEC's table through the store's own serving driver."""

    def __init__(self, store: Store, spec: MaterializationSpec = SPEC) -> None:
        if isinstance(store, PostgresServingStore):
            self.server = ThreadedDriverServer(lambda _open: PostgresServingTransactor(store),
                                               PostgresServingConnector(store))
        else:
            self.server = ThreadedDriverServer(lambda _open: ServingTransactor(store), ServingConnector(store))
        self.store = store
        self.runtime: Runtime = self.server.runtime(spec)
        self.runtime.open()
        self.ids: set[int] = set()

    def commit(self, rows: Sequence[tuple[Any, ...]] = (), deleted: Sequence[int] = ()) -> int:
        """Upsert `rows` (id, name, doc, price, x, at) and delete ids; returns the commit's timestamp."""
        new = [r for r in rows if r[0] not in self.ids]
        updated = [r for r in rows if r[0] in self.ids]
        stores = [StoreColumns(0, rows=_table(new) if new else None, updated=_table(updated) if updated else None,
                               deleted=pa.table({"id": pa.array(list(deleted), pa.int64())}) if deleted else None)]
        self.runtime.transact([], {"batch": next(_batches)}, stores if rows or deleted else [])
        self.ids = (self.ids | {r[0] for r in rows}) - set(deleted)
        latest = self.store.latest_timestamp(MATERIALIZATION)
        assert latest is not None
        return latest

    def store_documents(self, documents: Sequence[tuple[list[Any], dict[str, Any]]]) -> None:
        """Row Stores of (key, document) into the spec's only binding."""
        self.runtime.transact([(0, key, document) for key, document in documents], {"batch": next(_batches)})

    def close(self) -> None:
        self.runtime.close()
        self.server.stop()


def _table(rows: Sequence[tuple[Any, ...]]) -> pa.Table:
    columns = list(zip(*rows, strict=True))
    return pa.table({"id": pa.array(columns[0], pa.int64()), "name": pa.array(columns[1], pa.string()),
                     "doc": pa.array(columns[2], pa.string()), "price": pa.array(columns[3], pa.decimal128(10, 2)),
                     "x": pa.array(columns[4], pa.float64()), "at": pa.array(columns[5], pa.timestamp("us", "UTC"))})


@pytest.fixture
def committer(store: Store) -> Iterator[Committer]:
    made = Committer(store)
    yield made
    made.close()


@pytest.fixture
def postgres_committer(postgres_store: PostgresServingStore) -> Iterator[Committer]:
    made = Committer(postgres_store)
    yield made
    made.close()


def row(n: int, name: str = "n") -> tuple[Any, ...]:
    return (n, f"{name}{n}", f'{{"k": {n}, "tag": "t{n}"}}', Decimal(f"{n}.50"), n / 10, AT)


def source_target(store: Store, select: str | None = None) -> SubscribeTarget:
    """SPEC's table as coordinator/subscribe.py's source_target sees it, or `SUBSCRIBE (select)` over it (named s)."""
    columns = ", ".join(quote_ident(column) for column in TYPES)
    target = SubscribeTarget(PATH, MATERIALIZATION, f"SELECT hr_timestamp, hr_diff, {columns} FROM {INPUT}")
    if select is None:
        return target
    query = parse_statement(f"SUBSCRIBE ({select}\n)").args["query"]
    return restrict(target, query, list(TYPES), store.dialect, query_sql=select)


def stream(store: Store, executor: ThreadPoolExecutor, target: SubscribeTarget, *, snapshot: bool = True,
           progress: bool = False, as_of: int | None = None, up_to: int | None = None) -> SubscriptionStream:
    return SubscriptionStream(store, executor, target, describe_target(store, target), snapshot=snapshot,
                              progress=progress, as_of=as_of, up_to=up_to)


async def next_batch(batches: AsyncIterator[Sequence[tuple[Any, ...]]], timeout: float = 10) -> list[tuple[Any, ...]]:
    return list(await asyncio.wait_for(batches.__anext__(), timeout))


def data(rows: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """(hr_diff, *data columns) of output rows without WITH PROGRESS."""
    return [(r[1], *r[2:]) for r in rows]


# ---- both stores -------------------------------------------------------------------------------------


def test_snapshot_then_changes_in_order(store: Store, committer: Committer, executor: ThreadPoolExecutor) -> None:
    first = committer.commit([row(1), row(2)])
    target = source_target(store)
    columns = describe_target(store, target)
    assert [(c.name, c.type_oid) for c in columns] == [
        ("id", pg.INT8), ("name", pg.TEXT), ("doc", pg.JSONB),
        ("price", pg.NUMERIC), ("x", pg.FLOAT8), ("at", pg.TIMESTAMPTZ)]
    reader = stream(store, executor, target)

    async def scenario() -> None:
        batches = reader.batches()
        snapshot = await next_batch(batches)
        assert {r[0] for r in snapshot} == {Decimal(first)}
        assert data(snapshot) == [(1, 1, "n1", '{"k": 1, "tag": "t1"}', Decimal("1.50"), 0.1, AT),
                                  (1, 2, "n2", '{"k": 2, "tag": "t2"}', Decimal("2.50"), 0.2, AT)]
        second = await asyncio.get_running_loop().run_in_executor(
            None, lambda: committer.commit([row(1, "m")], deleted=[2]))
        changes = await next_batch(batches)
        assert [r[0] for r in changes] == [Decimal(second)] * 3
        assert sorted(data(changes)[:2]) == [(-1, 1, "n1", '{"k": 1, "tag": "t1"}', Decimal("1.50"), 0.1, AT),
                                             (-1, 2, "n2", '{"k": 2, "tag": "t2"}', Decimal("2.50"), 0.2, AT)]
        assert data(changes)[2] == (1, 1, "m1", '{"k": 1, "tag": "t1"}', Decimal("1.50"), 0.1, AT)
        reader.cancel()
        with pytest.raises(StopAsyncIteration):  # cancelled: the stream ends
            await next_batch(batches)

    asyncio.run(scenario())


def test_as_of_up_to_and_snapshot_false(store: Store, committer: Committer, executor: ThreadPoolExecutor) -> None:
    first = committer.commit([row(1), row(2)])
    time.sleep(0.002)
    second = committer.commit([row(3)], deleted=[1])
    time.sleep(0.002)
    third = committer.commit([row(4)])

    async def scenario() -> None:
        # AS OF the first commit, after two more: the first commit's rows (later changes undone and consolidated)
        reader = stream(store, executor, source_target(store, "SELECT id FROM s"), as_of=first, up_to=third)
        batches = reader.batches()
        assert sorted(await next_batch(batches)) == [(Decimal(first), 1, 1), (Decimal(first), 1, 2)]
        # then the changes below UP TO (exclusive), then the end
        assert await next_batch(batches) == [(Decimal(second), -1, 1), (Decimal(second), 1, 3)]
        with pytest.raises(StopAsyncIteration):
            await next_batch(batches)
        # WITH (SNAPSHOT false): only the changes after AS OF
        later = stream(store, executor, source_target(store, "SELECT id FROM s"), snapshot=False, as_of=second)
        later_batches = later.batches()
        assert await next_batch(later_batches) == [(Decimal(third), 1, 4)]
        later.cancel()

    asyncio.run(scenario())


def test_progress_rows_while_nothing_changes(store: Store, committer: Committer, executor: ThreadPoolExecutor,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subscribe, "PROGRESS_INTERVAL_MS", 1)
    committer.commit([row(1)])
    target = source_target(store, "SELECT id FROM s")
    reader = stream(store, executor, target, progress=True)
    assert [c.name for c in output_columns(describe_target(store, target), True)] == [
        "hr_timestamp", "hr_progressed", "hr_diff", "id"]

    async def scenario() -> None:
        batches = reader.batches()
        [(_, progressed, diff, one)] = await next_batch(batches)
        assert (progressed, diff, one) == (False, 1, 1)
        time.sleep(0.002)
        frontier = await asyncio.get_running_loop().run_in_executor(None, committer.commit)  # no rows changed
        assert await next_batch(batches) == [(Decimal(frontier), True, None, None)]
        reader.cancel()

    asyncio.run(scenario())


def test_compacted_changes_are_refused(store: Store, committer: Committer, executor: ThreadPoolExecutor) -> None:
    first = committer.commit([row(1)])
    time.sleep(0.002)
    second = committer.commit([row(2)])
    assert store.compact_changelogs(retention_ms=0, now_ms=second) == {changelog_name(PATH): 1}
    with pytest.raises(ChangelogCompacted, match="compacted"):
        stream(store, executor, source_target(store), as_of=first - 1)._read_snapshot()
    with pytest.raises(ChangelogCompacted, match="compacted"):
        stream(store, executor, source_target(store))._read_changes(first - 1)
    position, rows = stream(store, executor, source_target(store, "SELECT id FROM s"))._read_snapshot()
    assert (position, sorted(rows)) == (second, [(Decimal(second), 1, 1), (Decimal(second), 1, 2)])


def test_an_arrangement_follows_the_changelog(store: Store, committer: Committer,
                                              executor: ThreadPoolExecutor) -> None:
    committer.commit([row(1), row(2)])
    target = source_target(store)
    columns = describe_target(store, target)

    async def scenario() -> None:
        arrangement = Arrangement(store, executor, target, columns, key_positions=[1])  # by name
        await arrangement.start()
        try:
            rows = await arrangement.current()
            assert rows == {("n1",): [row(1)], ("n2",): [row(2)]} and arrangement.row_count == 2
            await asyncio.get_running_loop().run_in_executor(None, lambda: committer.commit([row(2, "m")],
                                                                                           deleted=[1]))
            rows = await arrangement.current()  # reflects every commit made before the call
            assert rows == {("m2",): [row(2, "m")]} and arrangement.row_count == 1
        finally:
            arrangement.close()

    asyncio.run(scenario())


def test_a_view_target_in_the_store_s_dialect(store: Store, executor: ThreadPoolExecutor) -> None:
    table = InputRelation(kind="table", item_id="u1", name="t", columns={"id": "int4", "n": "numeric", "v": "varchar"},
                          key=("id",), append_only=False)
    plan = compile_view(parse_statement("CREATE MATERIALIZED VIEW v AS SELECT id, n * 2 AS dbl, v, id + 1 AS next "
                                        "FROM t"),  # type: ignore[arg-type]
                        lambda schema, name: table if name == "t" else None)
    binding = view_binding(plan, "u9")
    committer = Committer(store, MaterializationSpec("view_u9", (binding,)))
    try:
        # a numeric output travels as PostgreSQL's numeric text (sql/view_numeric.py)
        committer.store_documents([(["[1]"], {"hr_key": "[1]", "o0": 1, "o1": "5.0", "o2": "a", "o3": 2}),
                                   (["[2]"], {"hr_key": "[2]", "o0": 2, "o1": "0.5", "o2": "b", "o3": 3})])
        target = view_target(plan, "u9", "view_u9", store.dialect)
        columns = describe_target(store, target)
        assert [(c.name, c.type_oid) for c in columns] == [
            ("id", pg.INT4), ("dbl", pg.NUMERIC), ("v", pg.VARCHAR if store.dialect == "postgres" else pg.TEXT),
            ("next", pg.INT4)]
        _, rows = stream(store, executor, target)._read_snapshot()
        expected = [(1, 1, 5, "a", 2), (1, 2, 0.5, "b", 3)]
        assert sorted(data(rows)) == expected
        if store.dialect == "postgres":  # numeric, as the view's public relation shows it
            assert [type(r[3]) for r in rows] == [Decimal, Decimal]
    finally:
        committer.close()


# ---- PostgreSQL: its SQL, types, values and errors -----------------------------------------------------


def test_the_subscribers_select_is_postgresql_s(postgres_store: PostgresServingStore,
                                                postgres_committer: Committer, executor: ThreadPoolExecutor) -> None:
    postgres_committer.commit([row(1), row(2), row(7)])
    select = ("SELECT id / 2 AS half, format('%s=%s', name, doc->>'k') AS f, price * 2 AS dbl, x::real AS r, "
              "doc #> '{tag}' AS tag, to_char(at, 'YYYY-MM-DD\"T\"HH24:MI') AS day, '716'::numeric AS n "
              "FROM s WHERE id <> 2 AND doc ? 'tag'")
    target = source_target(postgres_store, select)
    columns = describe_target(postgres_store, target)
    assert columns == (Column("half", pg.INT8, 8, -1), Column("f", pg.TEXT, -1, -1),
                       Column("dbl", pg.NUMERIC, -1, -1), Column("r", pg.FLOAT4, 4, -1),
                       Column("tag", pg.JSONB, -1, -1), Column("day", pg.TEXT, -1, -1),
                       Column("n", pg.NUMERIC, -1, -1))
    price = describe_target(postgres_store, source_target(postgres_store, "SELECT price FROM s"))
    assert price == (Column("price", pg.NUMERIC, -1, (10 << 16 | 2) + 4),)  # numeric(10,2)'s typmod
    _, rows = stream(postgres_store, executor, target)._read_snapshot()
    assert sorted(data(rows)) == [
        (1, 0, "n1=1", Decimal("3.00"), pytest.approx(0.1), '"t1"', "2023-11-14T22:13", Decimal("716")),
        (1, 3, "n7=7", Decimal("15.00"), pytest.approx(0.7), '"t7"', "2023-11-14T22:13", Decimal("716"))]


def test_values_print_as_postgresql_prints_them(postgres_store: PostgresServingStore,
                                                postgres_committer: Committer, executor: ThreadPoolExecutor) -> None:
    postgres_committer.commit([(1, "a", '{"b":[1.0, 2],"a":{"z":null}}', Decimal("12.30"), 1e-7, AT),
                               (2, "b", '"x"', Decimal("-0.05"), 123456789012345680.0, AT)])
    outputs = {"id": "id", "doc": "doc", "price": "price", "x": "x", "at": "at", "r": "x::real", "d": "at::date",
               "local": "at::timestamp", "span": "interval '3 days 04:05:06.5'", "prices": "ARRAY[price, 1]",
               "range": "int4range(id::int, 9)", "u": "md5(name)::uuid", "raw": "convert_to(name, 'UTF8')",
               "nan": "'NaN'::float8", "t": "at::time", "ok": "id > 1", "words": "ARRAY[name, NULL, 'a \"b']",
               "big": "price * 1e30", "small": "x::real / 3"}
    select = f"SELECT {', '.join(f'{e} AS {n}' for n, e in outputs.items())} FROM s"
    target = source_target(postgres_store, select)
    columns = describe_target(postgres_store, target)
    assert [c.name for c in columns] == list(outputs)
    _, rows = stream(postgres_store, executor, target)._read_snapshot()
    encoded = sorted(tuple(None if value is None else pg.value_encoder(column.type_oid, pg.TEXT_FORMAT)(value)
                           for value, column in zip(r[2:], columns, strict=True)) for r in rows)
    with psycopg.connect(postgres_store.conninfo) as conn:  # PostgreSQL's own output text of the same SELECT
        conn.execute("SET TimeZone = 'UTC'")
        cursor = conn.cursor()
        for column in columns:
            cursor.adapters.register_loader(column.type_oid, TextLoader)
        expected = sorted(tuple(None if v is None else v.encode() for v in r) for r in cursor.execute(
            f"{select.replace(' FROM s', ' FROM headrace_internal.source_s1')}").fetchall())
    for got, wanted in zip(encoded, expected, strict=True):
        assert dict(zip(outputs, got, strict=True)) == dict(zip(outputs, wanted, strict=True))
    # and in binary, for every type headrace has a codec for (the others travel as text: pgwire/types)
    known = [i for i, column in enumerate(columns) if column.type_oid in pg.TYPES]
    encoded_binary = sorted(tuple(None if r[2 + i] is None else
                                  pg.value_encoder(columns[i].type_oid, pg.BINARY_FORMAT)(r[2 + i]) for i in known)
                            for r in rows)
    with psycopg.connect(postgres_store.conninfo) as conn:
        cursor = conn.cursor(binary=True)
        for column in columns:
            cursor.adapters.register_loader(column.type_oid, _RawBinary)
        expected_binary = sorted(tuple(r[i] for i in known) for r in cursor.execute(
            f"{select.replace(' FROM s', ' FROM headrace_internal.source_s1')}").fetchall())
    for got, wanted in zip(encoded_binary, expected_binary, strict=True):
        names = [list(outputs)[i] for i in known]
        assert dict(zip(names, got, strict=True)) == dict(zip(names, wanted, strict=True))
    assert b'{"a": {"z": null}, "b": [1.0, 2]}' in encoded[0] and b"12.30" in encoded[0]


class _RawBinary(Loader):
    format = pq.Format.BINARY

    def load(self, data: Any) -> bytes:
        return bytes(data)


def test_postgresql_errors_keep_their_sqlstate(postgres_store: PostgresServingStore,
                                               postgres_committer: Committer, executor: ThreadPoolExecutor) -> None:
    postgres_committer.commit([row(1)])
    with pytest.raises(HeadraceError) as missing:
        describe_target(postgres_store, source_target(postgres_store, "SELECT nosuch FROM s"))
    assert (missing.value.sqlstate, missing.value.message) == ("42703", 'column "nosuch" does not exist')
    assert missing.value.position is None  # PostgreSQL's points into headrace's SQL, not the client's
    with pytest.raises(HeadraceError) as function:
        describe_target(postgres_store, source_target(postgres_store, "SELECT no_such_function(id) FROM s"))
    assert function.value.sqlstate == "42883" and function.value.hint is not None
    for select, sqlstate, message in [
            ("SELECT 1 / (id - 1) AS q FROM s", "22012", "division by zero"),
            ("SELECT name::int AS n FROM s", "22P02", 'invalid input syntax for type integer: "n1"'),
            ("SELECT 'infinity'::timestamptz AS t FROM s", "0A000",
             "SUBSCRIBE cannot send a value PostgreSQL printed: timestamp too large (after year 10K): 'infinity'"),
            ("SELECT ARRAY['-infinity'::date] AS t FROM s", "0A000",
             'SUBSCRIBE cannot send the date[] value "{-infinity}"'),
            ("SELECT interval '1 month' AS i FROM s", "0A000", 'SUBSCRIBE cannot send the interval value "1 mon"'),
            ("SELECT '-3 days +04:05:06'::interval AS i FROM s", "0A000",
             'SUBSCRIBE cannot send the interval value "-3 days +04:05:06"')]:
        reader = stream(postgres_store, executor, source_target(postgres_store, select))
        with pytest.raises(HeadraceError) as failed:
            reader._read_snapshot()
        assert (failed.value.sqlstate, failed.value.message) == (sqlstate, message)


def test_the_subscribers_text_runs_as_written(postgres_store: PostgresServingStore,
                                              postgres_committer: Committer, executor: ThreadPoolExecutor) -> None:
    postgres_committer.commit([row(1), row(2), row(3)])
    for select, expected in [
            ("SELECT *, S.name AS again, interval '3 days 04:05:06' AS span FROM s AS S WHERE id >= 2 -- the end",
             [(1, *row(n), f"n{n}", datetime.timedelta(days=3, seconds=14706)) for n in (2, 3)]),
            ('SELECT x.* FROM public.s x WHERE x.doc->>\'tag\' IN (\'t1\', \'t3\')', [(1, *row(n)) for n in (1, 3)]),
            ("SELECT (ARRAY[id, id * 10])[2] AS tens, substring(name FROM 2) AS rest FROM s WHERE (id, name) = "
             "(1, 'n1')", [(1, 10, "1")])]:
        target = source_target(postgres_store, select)
        assert target.select_sql.endswith(f" WHERE {select.split(' WHERE ')[1]}\n")  # spliced, not regenerated
        _, rows = stream(postgres_store, executor, target)._read_snapshot()
        assert sorted(data(rows)) == expected


def test_splicing_the_subscribers_text() -> None:
    columns = ["id", "Name"]
    assert subscriber_select("SELECT * FROM t WHERE id > 1 -- c", "t", "<input>", columns) == (
        'SELECT "t".hr_timestamp, "t".hr_diff, "t"."id", "t"."Name" FROM (<input>) AS "t" WHERE id > 1 -- c\n')
    assert subscriber_select("SELECT f(a, b), t.* , g[1:2] FROM s AS t", "t", "<input>", columns) == (
        'SELECT "t".hr_timestamp, "t".hr_diff, f(a, b), "t"."id", "t"."Name", g[1:2] FROM (<input>) AS "t"')
    assert subscriber_select('SELECT "T".* FROM s AS "T"', "T", "<i>", columns) == (
        'SELECT "T".hr_timestamp, "T".hr_diff, "T"."id", "T"."Name" FROM (<i>) AS "T"')
    assert subscriber_select("SELECT extract(year FROM at) FROM s", "s", "<i>", columns) == (
        'SELECT "s".hr_timestamp, "s".hr_diff, extract(year FROM at) FROM (<i>) AS "s"')
    assert subscriber_select("VALUES (1)", "s", "<i>", columns) is None
    assert subscriber_select("SELECT FROM s", "s", "<i>", columns) is None


def test_the_subscribers_select_runs_as_an_unprivileged_reader(postgres_store: PostgresServingStore,
                                                               postgres_committer: Committer,
                                                               executor: ThreadPoolExecutor) -> None:
    postgres_committer.commit([row(1)])
    target = source_target(postgres_store, "SELECT current_user AS who, current_setting('search_path') AS path FROM s")
    describe_target(postgres_store, target)
    _, rows = stream(postgres_store, executor, target)._read_snapshot()
    assert data(rows) == [(1, READER_ROLE, "pg_catalog")]
    with psycopg.connect(postgres_store.conninfo, autocommit=True) as conn:
        assert conn.execute("SELECT rolsuper OR rolcreaterole OR rolcreatedb OR rolbypassrls, rolcanlogin FROM "
                            "pg_roles WHERE rolname = %s", [READER_ROLE]).fetchone() == (False, True)
        admin = conn.execute("SELECT current_user").fetchone()[0]  # type: ignore[index]
    # its connections log in as the reader: no way back to the admin (SET ROLE on an admin's connection had one)
    escape = source_target(postgres_store, f"SELECT set_config('session_authorization', '{admin}', true) AS a, "
                                           "pg_read_file('/etc/hostname') AS b FROM s")
    with pytest.raises(HeadraceError) as escaped:
        describe_target(postgres_store, escape)
    assert escaped.value.sqlstate == "42501"
    with psycopg.connect(postgres_store.conninfo, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION public.mine(bigint) RETURNS bigint LANGUAGE sql AS 'SELECT $1'")
    with pytest.raises(HeadraceError) as read_file:  # a superuser's function: the store's admin could
        describe_target(postgres_store, source_target(postgres_store, "SELECT pg_read_file('/etc/hostname') FROM s"))
    assert (read_file.value.sqlstate, read_file.value.message) == ("42501",
                                                                    "permission denied for function pg_read_file")
    with pytest.raises(HeadraceError) as unqualified:  # only PostgreSQL's own functions are on the search_path
        describe_target(postgres_store, source_target(postgres_store, "SELECT mine(id) FROM s"))
    assert unqualified.value.sqlstate == "42883"
    for refused in ["SELECT public.mine(id) FROM s", "SELECT query_to_xml('SELECT 1', true, true, '') FROM s",
                    "SELECT id FROM s WHERE table_to_xml('headrace_internal.checkpoints', true, true, '') IS NULL",
                    "SELECT pg_advisory_lock(id) FROM s"]:
        with pytest.raises(HeadraceError) as outside:
            source_target(postgres_store, refused)
        assert outside.value.sqlstate == "0A000"
    gone = SubscribeTarget(("headrace_internal", "source_gone"), "source_gone", "SELECT * FROM __hr_input")
    with pytest.raises(HeadraceError) as missing_table:
        describe_target(postgres_store, gone)
    assert missing_table.value.sqlstate == "42P01"
    # one statement only, whatever the text holds: a second one (which could COMMIT and so end the reader's role)
    # is PostgreSQL's error, never run
    hidden = ("SELECT hr_timestamp, hr_diff, id FROM __hr_input) AS a; COMMIT; "
              "SELECT pg_read_file('/etc/hostname') FROM (SELECT 1")
    for read in (lambda conn: describe_columns(conn, changelog_table(PATH), hidden),
                 lambda conn: fetch_rows(conn, f"SELECT * FROM {changelog_table(PATH)}", hidden, [], 2)):
        with reading(postgres_store) as conn, pytest.raises(HeadraceError) as two:
            read(conn)
        assert (two.value.sqlstate, two.value.message) == ("42601", "cannot insert multiple commands into a "
                                                                    "prepared statement")
    pg_catalog = source_target(postgres_store, "SELECT pg_catalog.upper(name) AS up FROM s")
    assert data(stream(postgres_store, executor, pg_catalog)._read_snapshot()[1]) == [(1, "N1")]


def test_cancel_ends_a_running_read(postgres_store: PostgresServingStore, postgres_committer: Committer,
                                    executor: ThreadPoolExecutor) -> None:
    postgres_committer.commit([row(1)])
    reader = stream(postgres_store, executor, source_target(postgres_store,
                                                            "SELECT id FROM s WHERE pg_sleep(60) IS NOT NULL"))

    async def scenario() -> float:
        batches = reader.batches()
        asyncio.get_running_loop().call_later(0.5, reader.cancel)
        started = time.monotonic()
        with pytest.raises(StopAsyncIteration):  # ended, not failed
            await next_batch(batches, timeout=30)
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 10


def test_an_external_store_whose_admin_is_not_a_superuser(executor: ThreadPoolExecutor) -> None:
    """An external store's admin need only own its database and have CREATEROLE (docs/store.md): it sets the reader
    role up, grants it what it reads, and may SET ROLE to it."""
    cluster = shared_cluster()
    admin, database = f"subscribe_admin_{next(_batches)}", f"subscribe_external_{next(_batches)}"
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        conn.execute(f"DROP ROLE IF EXISTS {admin}")
        conn.execute(f"CREATE ROLE {admin} LOGIN CREATEROLE")
        conn.execute(f"CREATE DATABASE {database} OWNER {admin}")
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:  # set up by another store of the cluster already
        if conn.execute("SELECT FROM pg_roles WHERE rolname = %s", [READER_ROLE]).fetchone() is None:
            conn.execute(f"CREATE ROLE {READER_ROLE} NOLOGIN NOINHERIT")
            conn.execute(f"COMMENT ON ROLE {READER_ROLE} IS '{READER_MARK}'")
    store = PostgresServingStore(cluster.dsn_of(database).replace("postgres@", f"{admin}@"))
    committer = Committer(store)
    try:
        committer.commit([row(1)])
        target = source_target(store, "SELECT id, current_user AS who FROM s")
        assert [c.name for c in describe_target(store, target)] == ["id", "who"]
        assert data(stream(store, executor, target)._read_snapshot()[1]) == [(1, 1, READER_ROLE)]
    finally:
        committer.close()
        store.close()
