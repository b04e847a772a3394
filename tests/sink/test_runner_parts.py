"""The sink runner's parts that hold no thread (sink/runner.py): the snapshot's split by what the target loaded, the
checkpoint's position, the compaction hold file, and the sink's materialization spec, which the reader's batches
must fit: real targets (a serving store for a keyed sink, a Parquet dataset for a delta sink) written with them,
transaction by transaction as the runner does, end equal to the relation. The reader's input lives in either serving
store (DuckDB, PostgreSQL); a keyed sink's serving-store target is of the same kind."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from headrace.catalog.sinks import Sink
from headrace.errors import HeadraceError
from headrace.materialize.drivers.parquet import ParquetTransactor
from headrace.materialize.drivers.postgres_serving import PostgresServingTransactor
from headrace.materialize.drivers.serving import ServingTransactor
from headrace.materialize.protocol import Open, StoreColumns
from headrace.sink.changes import DELTA_COLUMNS, ChangeReader
from headrace.sink.configs import Endpoint
from headrace.sink.inputs import SinkInput, SinkStore
from headrace.sink.runner import _position_of, _split_by_loaded, read_hold, sink_spec, write_hold
from headrace.store.serving import ServingStore

from .test_changes import (DELETE, FULL_KEY_RANGE, PUT, REWRITE, SERVING_STORES, KeyedRelation, new_store,
                           stored_rows, summed)

# ------------------------------------------------------------------------------------------------ _split_by_loaded


def split_rows(table: pa.Table | None) -> list[dict[str, Any]]:
    return [] if table is None else sorted(table.to_pylist(), key=repr)


@pytest.mark.parametrize("keys, loaded_type", [([5, 1, 2**40, -3], pa.int32()), (["b", "", "é", "a'"], pa.string())])
def test_loaded_keys_are_updates_and_the_rest_new_rows(keys: list[Any], loaded_type: pa.DataType) -> None:
    key_type = pa.int64() if loaded_type == pa.int32() else pa.string()
    partials = pa.table({"k": pa.array(keys, key_type), "v": ["w", None, "y", "z"],
                         "at": pa.array([1, 2, 3, 4], pa.timestamp("us", tz="UTC"))})
    held = [keys[0], keys[3]]
    # The driver's loaded rows: the key in its own type, its stored (older) values, and no key the sink lacks.
    loaded = pa.table({"k": pa.array(held, loaded_type), "v": ["old", "old"]})
    stores = _split_by_loaded(["k"])(partials, loaded)
    assert stores.rows is not None and stores.updated is not None and stores.deleted is None
    assert stores.rows.schema == partials.schema and stores.updated.schema == partials.schema
    rows = partials.to_pylist()
    assert split_rows(stores.updated) == split_rows(pa.Table.from_pylist([rows[0], rows[3]], partials.schema))
    assert split_rows(stores.rows) == split_rows(pa.Table.from_pylist([rows[1], rows[2]], partials.schema))


def test_nothing_loaded_makes_every_key_a_new_row() -> None:
    partials = pa.table({"k": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})
    split = _split_by_loaded(["k"])
    for loaded in (None, pa.table({"k": pa.array([], pa.int64()), "v": pa.array([], pa.string())})):
        stores = split(partials, loaded)
        assert stores.rows is partials and stores.updated is None and stores.deleted is None


def test_every_key_loaded_leaves_no_new_rows_and_a_composite_key_matches_whole() -> None:
    partials = pa.table({"a": [1, 1, 2], "b": ["x", "y", "x"], "v": [10, 20, 30]})
    split = _split_by_loaded(["a", "b"])
    every = split(partials, pa.table({"a": [2, 1, 1], "b": ["x", "y", "x"]}))
    assert every.rows is None and split_rows(every.updated) == split_rows(partials)
    # (1, "x") and (2, "y") are loaded, (2, "y") matches no partial: half a key is no match.
    some = split(partials, pa.table({"a": [1, 2], "b": ["x", "y"]}))
    assert split_rows(some.updated) == [{"a": 1, "b": "x", "v": 10}]
    assert split_rows(some.rows) == [{"a": 1, "b": "y", "v": 20}, {"a": 2, "b": "x", "v": 30}]


# ------------------------------------------------------------------------------------------------ _position_of


def test_the_position_of_a_checkpoint() -> None:
    assert _position_of(None) is None  # never committed: a snapshot first
    assert _position_of({}) is None  # the driver's explicit zero: rebuild from a snapshot
    assert _position_of({"upto": 1_700_000_000_123}) == 1_700_000_000_123
    assert _position_of({"upto": 0}) == 0


@pytest.mark.parametrize("checkpoint", [{"batch_id": 3}, {"upto": "17"}, {"upto": 1.5}, {"upto": None}, {"upto": True}])
def test_a_foreign_checkpoint_is_refused(checkpoint: dict[str, Any]) -> None:
    with pytest.raises(HeadraceError, match="is not one of headrace's"):
        _position_of(checkpoint)


# ------------------------------------------------------------------------------------------------ hold file


def test_the_hold_round_trips_and_an_unknown_hold_holds_everything(tmp_path: Path) -> None:
    state_dir = tmp_path / "sinks" / "s1"
    assert read_hold(state_dir) == 0  # no directory yet
    write_hold(state_dir, 1_700_000_000_000)  # creates the directory
    assert read_hold(state_dir) == 1_700_000_000_000
    write_hold(state_dir, 1_700_000_000_500)
    assert read_hold(state_dir) == 1_700_000_000_500
    assert sorted(path.name for path in state_dir.iterdir()) == ["position"]  # the temporary file was renamed
    for garbled in ("", "12ab", "1.5\n"):
        (state_dir / "position").write_text(garbled)
        assert read_hold(state_dir) == 0, garbled
    (state_dir / "position").unlink()
    assert read_hold(state_dir) == 0


# ------------------------------------------------------------------------------------------------ sink_spec


def a_sink(delta_updates: bool) -> Sink:
    return Sink(id="abc123", name="orders_out", relation_schema="public", relation_name="orders", driver="postgres",
                options={}, create_sql="CREATE SINK orders_out FROM orders INTO POSTGRES (...)",
                delta_updates=delta_updates)


ORDERS = SinkInput("table", "public.orders", ("headrace_internal", "orders"), "orders",
                   "SELECT hr_timestamp, hr_diff, region, id, total, note FROM __hr_input", ("region", "id"))
ORDER_COLUMNS = [("region", "VARCHAR"), ("id", "BIGINT"), ("total", "DOUBLE"), ("note", "JSON")]
ENDPOINT = Endpoint("postgres", {"url": "postgresql://h/db"}, ("public", "orders_out"))


def test_a_keyed_sink_spec_keys_the_input_key() -> None:
    spec = sink_spec(a_sink(False), ENDPOINT, ORDERS, ORDER_COLUMNS)
    assert spec.name == "sink_abc123" and spec.config == {"url": "postgresql://h/db"}
    (binding,) = spec.bindings
    assert binding.resource_path == ("public", "orders_out") and not binding.delta_updates
    assert binding.key == ("region", "id") and binding.values == ("total", "note")
    assert list(binding.column_types.items()) == ORDER_COLUMNS


def test_a_delta_sink_spec_adds_the_change_columns_to_the_key() -> None:
    (binding,) = sink_spec(a_sink(True), ENDPOINT, ORDERS, ORDER_COLUMNS).bindings
    assert binding.delta_updates
    assert binding.key == ("region", "id", "hr_timestamp", "hr_diff") and binding.values == ("total", "note")
    assert binding.column_types == {**dict(ORDER_COLUMNS), **dict(DELTA_COLUMNS)}
    assert list(binding.column_types) == list(binding.columns)  # types in the binding's column order


# ------------------------------------------------------------------------------------------------ spec + reader


@pytest.fixture(params=SERVING_STORES)
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KeyedRelation]:
    (tmp_path / "source").mkdir()
    store = new_store(request.param, tmp_path / "source")
    relation = KeyedRelation(store, "VARCHAR")
    yield relation
    relation.close()
    store.close()


Transactor = ServingTransactor | PostgresServingTransactor | ParquetTransactor


def send(relation: KeyedRelation, reader: ChangeReader, transactor: Transactor,
         reopen: Callable[[Transactor, int], Transactor] | None = None) -> int:
    """The runner's loop without its thread: a snapshot at the relation's first commit, then the changes after it,
    each batch one transaction committing {"upto": U}, until nothing is left. `reopen` (after the second
    transaction) closes the transactor and opens another, as a restart would. Returns the transactions."""
    batch = reader.next_batch(None, snapshot_at=relation.commits[0].timestamp)
    transactions = 0
    while batch is not None:
        if batch.delta is not None:
            transactor.store_columns(StoreColumns(0, rows=batch.delta))
        else:
            transactor.store_columns(StoreColumns(0, rows=batch.rows, updated=batch.updated, deleted=batch.deleted))
        transactor.start_commit({"upto": batch.upto})
        transactor.acknowledge()
        transactions += 1
        if transactions == 2 and reopen is not None:
            transactor = reopen(transactor, batch.upto)
        batch = reader.next_batch(batch.upto)
    transactor.close()
    return transactions


def write_history(relation: KeyedRelation) -> None:
    relation.commit({"a": (PUT, "x", 0)})  # the snapshot's commit
    relation.commit({"a": (PUT, "x", 1), "b": (PUT, None, 2), "c": (PUT, "z", 3)})
    relation.commit({"a": (PUT, "x2", 1), "b": (DELETE,), "d": (PUT, "w", 4)})
    relation.commit({"b": (PUT, "back", 5), "c": (REWRITE,), "d": (DELETE,)})


def test_a_keyed_sinks_batches_rebuild_the_relation_in_a_serving_store_target(
        source: KeyedRelation, tmp_path: Path) -> None:
    """The serving store as the target is strict about `exists` (a new row is a plain INSERT under a PRIMARY KEY)
    and holds the checkpoint: a reopened target resumes where the last transaction ended."""
    endpoint = Endpoint("serving", {}, ("public", "orders_out"))
    spec = sink_spec(a_sink(False), endpoint, source.input, source.input.columns(source.store))
    (tmp_path / "target").mkdir()
    target: SinkStore = new_store(source.store.dialect, tmp_path / "target")
    try:
        def open_target() -> tuple[Transactor, int | None]:
            transactor = ServingTransactor(target) if isinstance(target, ServingStore) \
                else PostgresServingTransactor(target)
            return transactor, _position_of(transactor.open(Open(spec, *FULL_KEY_RANGE)).runtime_checkpoint)

        def reopen(transactor: Transactor, upto: int) -> Transactor:
            transactor.close()
            reopened, position = open_target()
            assert position == upto
            return reopened

        write_history(source)
        transactor, position = open_target()
        assert position is None
        assert send(source, source.reader(max_changes=3), transactor, reopen) > 2
        rows = stored_rows(target, endpoint.resource_path)
        assert {row["k"]: (row["v"], row["n"]) for row in rows} == source.state
        assert open_target()[1] == source.commits[-1].timestamp
    finally:
        target.close()


def test_a_delta_sinks_batches_fit_its_spec_in_a_parquet_target(source: KeyedRelation, tmp_path: Path) -> None:
    """The delta table (hr_timestamp, hr_diff first) lands in the spec's columns: every change once, the snapshot
    at its timestamp."""
    endpoint = Endpoint("parquet", {"path": str(tmp_path / "parquet")}, ("orders_out",))
    spec = sink_spec(a_sink(True), endpoint, source.input, source.input.columns(source.store))
    write_history(source)
    transactor = ParquetTransactor()
    transactor.open(Open(spec, *FULL_KEY_RANGE))
    assert send(source, source.reader(True, max_changes=3), transactor) > 2
    written = pq.read_table(tmp_path / "parquet" / "orders_out")
    assert written.schema.names == list(spec.bindings[0].columns)
    rows = [(r["hr_timestamp"], r["hr_diff"], r["k"], r["v"], r["n"]) for r in written.to_pylist()]
    first = source.commits[0].timestamp
    snapshot = Counter({(first, 1, "a", "x", 0): 1})
    assert Counter(rows) == snapshot + source.expected_deltas(first, source.commits[-1].timestamp)
    assert summed(rows) == source.state
