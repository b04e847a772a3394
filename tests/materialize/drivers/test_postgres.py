"""The POSTGRES sink driver against a real PostgreSQL 15 (started by the tests), driven by a real Runtime over the
real connection loop (hosted_driver). One cluster and one driver server for the module; a fresh schema per test.

Run as a script, this module is the runtime process of the kill -9 test (see `_worker`)."""

from __future__ import annotations

import base64
import datetime
import itertools
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pyarrow as pa
import pytest

from headrace.materialize.columnar import ColumnarDocuments, ColumnarStores
from headrace.materialize.drivers import postgres as postgres_driver
from headrace.materialize.drivers.postgres import PostgresConnector, PostgresTransactor
from headrace.materialize.protocol import (
    FIELD_FORBIDDEN,
    INCOMPATIBLE,
    LOCATION_RECOMMENDED,
    LOCATION_REQUIRED,
    Binding,
    DriverError,
    FencedOff,
    MaterializationSpec,
    Request,
    Response,
    StartCommit,
    StoreColumns,
    ValidateBinding,
)
from headrace.materialize.runtime import RpcDriverConnection, Runtime

if __name__ != "__main__":  # the worker process needs neither
    from tests.materialize.drivers.conftest import HostedDriver, hosted_driver
    from tests.real_servers.postgres import PostgresCluster

# Every type of the type map, with values that are hard to carry (quotes, newlines, NULL vs '', extremes).
TYPES = {"k": "VARCHAR", "b": "BOOLEAN", "si": "SMALLINT", "i": "INTEGER", "bi": "BIGINT", "h": "HUGEINT",
         "d": "DOUBLE", "f": "FLOAT", "dec": "DECIMAL(18,2)", "v": "VARCHAR", "u": "UUID", "j": "JSON",
         "tz": "TIMESTAMPTZ", "ts": "TIMESTAMP", "dt": "DATE", "bl": "BLOB"}
VALUES = tuple(name for name in TYPES if name != "k")
ROWS: list[dict[str, Any]] = [
    {"k": "plain", "b": True, "si": -32768, "i": 2**31 - 1, "bi": -2**63, "h": 2**100, "d": 1e300, "f": 0.5,
     "dec": "12.50", "v": "", "u": "0c6f7c1e-0000-4000-8000-000000000001", "j": {"a": [1, 2.5, "x"], "b": None},
     "tz": 1_700_000_000_123_456, "ts": -1, "dt": "2024-02-29", "bl": base64.b64encode(b"\x00\xff\n\",").decode()},
    {"k": 'quo"te,\nline', "b": False, "si": 0, "i": -1, "bi": 2**63 - 1, "h": -2**120, "d": -0.0, "f": -1.25,
     "dec": "-0.01", "v": 'a "b", c\nd \\. ü✓', "u": "ffffffff-ffff-4fff-bfff-ffffffffffff", "j": [1, "two", True],
     "tz": -62_135_596_800_000_000, "ts": 253_402_300_799_999_999, "dt": "0001-01-01", "bl": ""},
    {"k": "", "b": None, "si": None, "i": None, "bi": None, "h": None, "d": None, "f": None, "dec": None, "v": None,
     "u": None, "j": None, "tz": None, "ts": None, "dt": None, "bl": None},
    {"k": "\\.", "b": True, "si": 7, "i": 8, "bi": 9, "h": 0, "d": 2.0, "f": 3.0, "dec": "9999999999999999.99",
     "v": "NULL", "u": "00000000-0000-0000-0000-000000000000", "j": "just a string", "tz": 0, "ts": 0,
     "dt": "1969-12-31", "bl": base64.b64encode(bytes(range(256))).decode()},
]
_EPOCH = datetime.datetime(1970, 1, 1)
_counter = itertools.count()


def expected_in_postgres(type_name: str, value: Any) -> Any:
    """What psycopg reads back for a document value stored in a column of type_name."""
    if value is None:
        return None
    if type_name == "HUGEINT" or type_name.startswith("DECIMAL"):
        return Decimal(value)
    if type_name == "UUID":
        return uuid.UUID(value)
    if type_name == "TIMESTAMPTZ":
        return (_EPOCH + datetime.timedelta(microseconds=value)).replace(tzinfo=datetime.timezone.utc)
    if type_name == "TIMESTAMP":
        return _EPOCH + datetime.timedelta(microseconds=value)
    if type_name == "DATE":
        return datetime.date.fromisoformat(value)
    if type_name == "BLOB":
        return base64.b64decode(value)
    return value


def spec_of(schema: str, dsn: str, types: dict[str, str] = TYPES, key: tuple[str, ...] = ("k",),
            table: str = "sink", delta: bool = False, name: str | None = None, **config: Any) -> MaterializationSpec:
    values = tuple(c for c in types if c not in key)
    return MaterializationSpec(name or f"sink_{schema}", (Binding((schema, table), key, values, dict(types), delta),),
                               config={"url": dsn, **config})


def table_rows(dsn: str, schema: str, table: str = "sink", order: str = "k") -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(f'SELECT * FROM "{schema}"."{table}" ORDER BY {order}').fetchall()


def checkpoints(dsn: str, schema: str) -> list[Any]:
    with psycopg.connect(dsn) as conn:
        return [row[0] for row in conn.execute(f'SELECT checkpoint FROM "{schema}".headrace_sink_transactions '
                                               "ORDER BY committed_at").fetchall()]


def documents(rows: list[dict[str, Any]], key: tuple[str, ...] = ("k",)) -> list[tuple[int, list[Any], dict]]:
    return [(0, [row[k] for k in key], row) for row in rows]


# ---------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with PostgresCluster(tmp_path_factory.mktemp("postgres")) as cluster:
        yield cluster.create_database("sinks")


@pytest.fixture(scope="module")
def host() -> Iterator[HostedDriver]:
    with hosted_driver(PostgresTransactor.factory, PostgresConnector()) as driver:
        yield driver


@pytest.fixture
def schema() -> str:
    return f"test_{next(_counter)}"


def opened(host: HostedDriver, spec: MaterializationSpec, **kwargs: Any) -> Runtime:
    runtime = host.runtime(spec, **kwargs)
    runtime.validate()
    runtime.apply()
    runtime.open()
    return runtime


# ---------------------------------------------------------------------------------------------- control


def test_spec_describes_config_and_resource(host: HostedDriver, dsn: str, schema: str) -> None:
    runtime = host.runtime(spec_of(schema, dsn))
    response = runtime.spec_of_driver()
    assert response.config_schema["required"] == ["url"]
    assert response.config_schema["properties"]["url"]["secret"] is True
    assert response.resource_config_schema["required"] == ["table"]
    runtime.close()


def test_validate_answers_a_constraint_per_field(host: HostedDriver, dsn: str, schema: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"; CREATE TABLE "{schema}".sink (k text PRIMARY KEY, n integer)')
    runtime = host.runtime(spec_of(schema, dsn, document_column="doc"))
    fields = {**TYPES, "n": "BIGINT", "iv": "INTERVAL", "tiny": "TINYINT", "doc": "JSON", "lst": "INTEGER[]"}
    validated = runtime.validate([ValidateBinding((schema, "sink"), ("k",), fields)])
    constraints = {name: c.type for name, c in validated.bindings[0].constraints.items()}
    assert constraints == {"k": LOCATION_REQUIRED, **{name: LOCATION_RECOMMENDED for name in VALUES},
                           "n": INCOMPATIBLE, "iv": LOCATION_RECOMMENDED, "tiny": INCOMPATIBLE, "lst": INCOMPATIBLE,
                           "doc": FIELD_FORBIDDEN}
    assert "integer, not bigint" in validated.bindings[0].constraints["n"].reason
    runtime.close()


def test_apply_creates_is_idempotent_adds_columns_and_refuses_changes(host: HostedDriver, dsn: str,
                                                                      schema: str) -> None:
    spec = spec_of(schema, dsn)
    runtime = host.runtime(spec)
    assert runtime.apply().action_description == (f"created {schema}.headrace_sink_checkpoints; created "
                                                  f"{schema}.headrace_sink_transactions; created table {schema}.sink")
    runtime.close()
    runtime = host.runtime(spec)
    assert runtime.apply().action_description == "no changes"
    runtime.close()
    with psycopg.connect(dsn) as conn:
        columns = dict(conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) || CASE WHEN attnotnull THEN ' not null' ELSE '' END "
            "FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0", [f'"{schema}".sink']).fetchall())
    assert columns == {"k": "text not null", "b": "boolean", "si": "smallint", "i": "integer", "bi": "bigint",
                       "h": "numeric(39,0)", "d": "double precision", "f": "real", "dec": "numeric(18,2)",
                       "v": "text", "u": "uuid", "j": "jsonb", "tz": "timestamp with time zone",
                       "ts": "timestamp without time zone", "dt": "date", "bl": "bytea"}
    runtime = host.runtime(spec_of(schema, dsn, {**TYPES, "extra": "DECIMAL(10,3)"}, document_column="doc"))
    assert runtime.apply().action_description == (f"added column extra numeric(10,3) to {schema}.sink; "
                                                  f"added column doc jsonb to {schema}.sink")
    runtime.close()
    for types, key, message in (({**TYPES, "i": "BIGINT"}, ("k",), "column i of"),
                                ({**TYPES, "new_key": "BIGINT"}, ("k", "new_key"), "changing the key")):
        runtime = host.runtime(spec_of(schema, dsn, types, key))
        with pytest.raises(DriverError, match=message):
            runtime.apply()
        runtime.close()


def test_a_role_without_create_on_the_database_sinks_into_its_schema(host: HostedDriver, dsn: str,
                                                                     schema: str) -> None:
    role = f"writer_{schema}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE {role} LOGIN; CREATE SCHEMA "{schema}"; '
                     f'GRANT USAGE, CREATE ON SCHEMA "{schema}" TO {role}; '
                     f"REVOKE CREATE ON DATABASE sinks FROM PUBLIC")
    writer_dsn = dsn.replace("postgresql://postgres@", f"postgresql://{role}@")
    runtime = opened(host, spec_of(schema, writer_dsn, {"k": "VARCHAR", "n": "BIGINT"}))
    runtime.transact(documents([{"k": "a", "n": 1}]), {"batch": 1})
    runtime.close()
    assert table_rows(dsn, schema) == [("a", 1)]
    # A delta-updates sink appends: a table with a primary key is refused.
    runtime = host.runtime(spec_of(schema, writer_dsn, {"k": "VARCHAR", "n": "BIGINT"}, delta=True))
    with pytest.raises(DriverError, match="has a primary key"):
        runtime.apply()
    runtime.close()


def test_bad_config_is_refused_without_echoing_the_url(host: HostedDriver, dsn: str, schema: str) -> None:
    for config, message, sqlstate in (({"url": dsn, "colour": "red"}, "unknown POSTGRES sink option", "22023"),
                                      ({"url": ""}, "needs a url", "22023"),
                                      ({"url": "postgresql://u:hunter2@127.0.0.1:1/db"}, "cannot connect to PostgreSQL",
                                       "08001")):
        runtime = host.runtime(MaterializationSpec("m", spec_of(schema, dsn).bindings, config=config))
        with pytest.raises(DriverError, match=message) as raised:
            runtime.apply()
        assert "hunter2" not in str(raised.value)
        assert raised.value.sqlstate == sqlstate  # the driver's code reaches CREATE SINK's client, not XX000
        runtime.close()


# ---------------------------------------------------------------------------------------------- row path


def test_every_type_round_trips_through_insert_update_delete(host: HostedDriver, dsn: str, schema: str) -> None:
    loaded: list[dict[str, Any]] = []

    def remember_loaded(older: dict[str, Any], newer: dict[str, Any]) -> dict[str, Any]:
        loaded.append(older)  # the runtime reduces a Loaded document with the new one here
        return newer

    spec = spec_of(schema, dsn)
    runtime = opened(host, spec)
    runtime.transact(documents(ROWS), {"batch": 1})
    assert table_rows(dsn, schema) == sorted(
        (tuple(expected_in_postgres(TYPES[c], row[c]) for c in TYPES) for row in ROWS), key=lambda r: r[0])
    runtime.close()

    # Loaded documents are what was stored; updates and deletions land (the runtime reduces with `older`).
    runtime = host.runtime(spec, reducers=[remember_loaded])
    assert runtime.open() == {"batch": 1}
    updated = [{**ROWS[0], "v": "changed", "j": {"nested": {"deep": [None]}}}, {**ROWS[2], "b": False},
               {"k": ROWS[1]["k"], "_meta": {"op": "d"}}, {**ROWS[3], "k": "new"}]
    runtime.transact(documents(updated), {"batch": 2})
    assert sorted(loaded, key=lambda d: d["k"]) == sorted(ROWS[:3], key=lambda d: d["k"])
    expected = [updated[0], updated[1], ROWS[3], updated[3]]
    assert table_rows(dsn, schema) == sorted(
        (tuple(expected_in_postgres(TYPES[c], row[c]) for c in TYPES) for row in expected), key=lambda r: r[0])
    runtime.close()
    assert checkpoints(dsn, schema) == [{"batch": 1}, {"batch": 2}]


def test_composite_keys_are_answered_in_the_loads_own_form(host: HostedDriver, dsn: str, schema: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A DECIMAL key sent as "1.5" reads back as "1.50": Loaded answers with the key as the Load sent it, so the
    runtime still matches it (an update, not a duplicate insert). One key per Load query here."""
    monkeypatch.setattr(postgres_driver, "LOAD_CHUNK", 1)
    types = {"day": "DATE", "price": "DECIMAL(10,2)", "at": "TIMESTAMPTZ", "n": "BIGINT"}
    key = ("day", "price", "at")
    spec = spec_of(schema, dsn, types, key)
    add = [lambda older, newer: {**newer, "n": newer["n"] + (older["n"] if older else 0)}]
    runtime = opened(host, spec, reducers=add)
    docs = [{"day": "2024-01-01", "price": "1.5", "at": 10, "n": 1}, {"day": "2024-01-01", "price": "2", "at": 10,
                                                                      "n": 1}]
    runtime.transact(documents(docs, key), {"batch": 1})
    runtime.transact(documents(docs, key), {"batch": 2})
    assert table_rows(dsn, schema, order="price") == [
        (datetime.date(2024, 1, 1), Decimal("1.50"), datetime.datetime(1970, 1, 1, 0, 0, 0, 10, datetime.UTC), 2),
        (datetime.date(2024, 1, 1), Decimal("2.00"), datetime.datetime(1970, 1, 1, 0, 0, 0, 10, datetime.UTC), 2)]
    runtime.close()


def test_document_column_holds_the_full_document(host: HostedDriver, dsn: str, schema: str) -> None:
    types = {"k": "VARCHAR", "n": "BIGINT", "at": "TIMESTAMPTZ", "price": "DECIMAL(10,2)", "bl": "BLOB"}
    spec = spec_of(schema, dsn, types, document_column="flow_document")
    seen: list[dict[str, Any] | None] = []
    runtime = opened(host, spec, reducers=[lambda older, newer: seen.append(older) or newer])
    runtime.transact(documents([{"k": "a", "n": 1, "at": 5, "price": "1.50", "bl": "AAE=", "extra": {"x": 1}}]),
                     {"batch": 1})
    runtime.transact(documents([{"k": "a", "n": 2, "at": 6, "price": "2.00", "bl": None}]), {"batch": 2})
    assert seen[-1] == {"k": "a", "n": 1, "at": 5, "price": "1.50", "bl": "AAE=", "extra": {"x": 1}}
    # Columnar Stores have no document: it is built from the columns, in the documents' conventions.
    columns = pa.table({"k": ["b"], "n": [3], "at": pa.array([7], pa.int64()), "price": ["0.10"],
                        "bl": pa.array([b"\x00\x01"], pa.binary())})
    runtime.transact([], {"batch": 3}, columns=[StoreColumns(0, rows=columns)])
    runtime.transact([], {"batch": 4}, columns=[StoreColumns(0, updated=columns.set_column(1, "n", pa.array([4])))])
    with psycopg.connect(dsn) as conn:
        stored = dict(conn.execute(f'SELECT k, flow_document FROM "{schema}".sink').fetchall())
    assert stored == {"a": {"k": "a", "n": 2, "at": 6, "price": "2.00", "bl": None},
                      "b": {"k": "b", "n": 4, "at": 7, "price": "0.10", "bl": "AAE="}}
    runtime.close()


def test_delta_updates_append_rows(host: HostedDriver, dsn: str, schema: str) -> None:
    types = {"k": "VARCHAR", "n": "BIGINT", "hr_timestamp": "BIGINT", "hr_diff": "BIGINT"}
    spec = spec_of(schema, dsn, types, delta=True)
    runtime = opened(host, spec)
    runtime.transact(documents([{"k": "a", "n": 1, "hr_timestamp": 10, "hr_diff": 1}]), {"batch": 1})
    runtime.transact(documents([{"k": "a", "n": 1, "hr_timestamp": 20, "hr_diff": -1},
                                {"k": "b", "n": 2, "hr_timestamp": 20, "hr_diff": 1}]), {"batch": 2})
    rows = pa.table({"k": ["a"], "n": [5], "hr_timestamp": [30], "hr_diff": [1]})
    runtime.transact([], {"batch": 3}, columns=[StoreColumns(0, rows=rows)])
    assert table_rows(dsn, schema, order="hr_timestamp, k") == [("a", 1, 10, 1), ("a", 1, 20, -1), ("b", 2, 20, 1),
                                                                ("a", 5, 30, 1)]
    with psycopg.connect(dsn) as conn:  # append-only: no primary key
        assert conn.execute("SELECT count(*) FROM pg_index WHERE indrelid = %s::regclass",
                            [f'"{schema}".sink']).fetchone() == (0,)
    runtime.close()


def test_a_value_the_column_cannot_hold_fails_the_transaction(host: HostedDriver, dsn: str, schema: str) -> None:
    spec = spec_of(schema, dsn, {"k": "VARCHAR", "n": "BIGINT", "dec": "DECIMAL(4,2)"})
    runtime = opened(host, spec)
    runtime.transact(documents([{"k": "a", "n": 1, "dec": "1.00"}]), {"batch": 1})
    with pytest.raises(DriverError, match="numeric field overflow"):
        runtime.transact(documents([{"k": "b", "n": 2, "dec": "123.00"}]), {"batch": 2})
    runtime.close()
    runtime = host.runtime(spec)
    with pytest.raises(DriverError, match="column 'n'"):
        runtime.open()
        runtime.transact(documents([{"k": "c", "n": "not a number", "dec": None}]), {"batch": 2})
    runtime.close()
    assert table_rows(dsn, schema) == [("a", 1, Decimal("1.00"))]
    assert checkpoints(dsn, schema) == [{"batch": 1}]


# ---------------------------------------------------------------------------------------------- columnar path


def duckdb_rows() -> pa.Table:
    """ROWS as DuckDB's own Arrow types (timestamp[us, tz], decimal128, date32, binary, ...)."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t (" + ", ".join(f'"{c}" {"JSON" if t == "JSON" else t}' for c, t in TYPES.items())
                + ")")
    for row in ROWS:
        values = []
        for c, t in TYPES.items():
            value = row[c]
            if value is not None and t in ("TIMESTAMPTZ", "TIMESTAMP"):
                value = expected_in_postgres(t, value)
            elif value is not None and t == "BLOB":
                value = base64.b64decode(value)
            elif value is not None and t == "JSON":
                value = json.dumps(value)
            values.append(value)
        con.execute(f"INSERT INTO t VALUES ({', '.join('?' * len(values))})", values)
    table = con.execute("SELECT * FROM t").fetch_arrow_table()
    assert table.schema.field("tz").type == pa.timestamp("us", tz="Etc/UTC")
    return table


def test_columnar_stores_and_loads_every_type(host: HostedDriver, dsn: str, schema: str) -> None:
    spec = spec_of(schema, dsn)
    runtime = opened(host, spec)
    rows = duckdb_rows()
    runtime.transact([], {"batch": 1}, columns=[StoreColumns(0, rows=rows)])
    expected = sorted((tuple(expected_in_postgres(TYPES[c], row[c]) for c in TYPES) for row in ROWS),
                      key=lambda r: r[0])
    assert table_rows(dsn, schema) == expected

    loaded_tables: list[pa.Table | None] = []

    def reduce(partials: pa.Table, loaded: pa.Table | None) -> ColumnarStores:
        loaded_tables.append(loaded)
        assert loaded is not None
        return ColumnarStores(updated=loaded.filter(pa.compute.equal(loaded["k"], "plain")),
                              deleted=loaded.filter(pa.compute.equal(loaded["k"], "")).select(["k"]),
                              rows=partials.filter(pa.compute.equal(partials["k"], "fresh")))

    partials = pa.table({"k": ["plain", "", "fresh", "absent"],
                         **{c: pa.nulls(4, rows.schema.field(c).type) for c in VALUES}})
    runtime.transact([], {"batch": 2}, columnar=[ColumnarDocuments(0, partials, reduce)])
    loaded = loaded_tables[0]
    assert loaded is not None and loaded.num_rows == 2
    assert loaded.schema.field("tz").type == pa.int64() and loaded.schema.field("ts").type == pa.timestamp("us")
    assert loaded.schema.field("dt").type == pa.date32() and loaded.schema.field("bl").type == pa.binary()
    assert loaded.schema.field("dec").type == pa.decimal128(18, 2)
    by_key = {row["k"]: row for row in loaded.to_pylist()}
    assert by_key[""] == {c: None for c in VALUES} | {"k": ""}
    plain = by_key["plain"]
    assert plain["tz"] == ROWS[0]["tz"] and plain["bl"] == base64.b64decode(ROWS[0]["bl"])
    assert plain["dec"] == Decimal("12.50") and plain["h"] == Decimal(2**100)
    assert plain["j"] == '{"a": [1, 2.5, "x"], "b": null}'  # jsonb's text
    assert plain["f"] == 0.5 and plain["d"] == 1e300 and plain["u"] == ROWS[0]["u"]
    assert plain["dt"] == datetime.date(2024, 2, 29) and plain["ts"] == _EPOCH - datetime.timedelta(microseconds=1)
    # "plain" was stored back as loaded (unchanged), "" deleted, "fresh" inserted with NULLs from the outer join.
    assert table_rows(dsn, schema) == sorted([expected[i] for i in range(len(expected)) if expected[i][0] != ""]
                                             + [("fresh",) + (None,) * len(VALUES)], key=lambda r: r[0])
    runtime.close()


def test_columnar_path_takes_int64_microseconds_and_doubles(host: HostedDriver, dsn: str, schema: str) -> None:
    types = {"k": "BIGINT", "at": "TIMESTAMPTZ", "d": "DOUBLE", "day": "DATE", "j": "JSON", "s": "VARCHAR"}
    runtime = opened(host, spec_of(schema, dsn, types))
    rows = pa.table({"k": pa.array([1, 2], pa.int32()), "at": pa.array([1, None], pa.int64()),
                     "d": pa.array([float("inf"), float("nan")]), "day": pa.array([0, 1], pa.int32()),
                     "j": pa.array(['{"a":1}', None], pa.large_string()),
                     "s": pa.array(["x", ""]).dictionary_encode()})
    runtime.transact([], {"batch": 1}, columns=[StoreColumns(0, rows=rows)])
    stored = table_rows(dsn, schema)
    assert stored[0][:2] == (1, datetime.datetime(1970, 1, 1, 0, 0, 0, 1, datetime.UTC))
    assert stored[0][2] == float("inf") and stored[1][2] != stored[1][2]  # NaN
    assert [r[3:] for r in stored] == [(datetime.date(1970, 1, 1), {"a": 1}, "x"),
                                       (datetime.date(1970, 1, 2), None, "")]
    runtime.close()


def test_loads_of_an_empty_table_answer_nothing(host: HostedDriver, dsn: str, schema: str) -> None:
    runtime = opened(host, spec_of(schema, dsn))
    loaded: list[pa.Table | None] = []

    def reduce(partials: pa.Table, stored: pa.Table | None) -> ColumnarStores:
        loaded.append(stored)
        return ColumnarStores(rows=partials)

    runtime.transact([], {"batch": 1}, columnar=[ColumnarDocuments(0, duckdb_rows(), reduce)])
    assert loaded[0] is not None and loaded[0].num_rows == 0
    assert loaded[0].schema == duckdb_schema_of_loaded(host, dsn, schema)
    assert len(table_rows(dsn, schema)) == len(ROWS)
    runtime.close()


def duckdb_schema_of_loaded(host: HostedDriver, dsn: str, schema: str) -> pa.Schema:
    """The schema of LoadedColumns when rows are found (a second runtime loads every stored key)."""
    runtime = host.runtime(spec_of(schema, dsn))
    runtime.open()
    found: list[pa.Schema] = []

    def reduce(partials: pa.Table, stored: pa.Table | None) -> ColumnarStores:
        assert stored is not None and stored.num_rows == len(ROWS)
        found.append(stored.schema)
        return ColumnarStores()

    runtime.transact([], {"batch": 2}, columnar=[ColumnarDocuments(0, pa.table({"k": [r["k"] for r in ROWS]}),
                                                                   reduce)])
    runtime.close()
    return found[0]


# ---------------------------------------------------------------------------------------------- fencing, crashes


def test_a_newer_open_fences_off_the_older_runtime(host: HostedDriver, dsn: str, schema: str) -> None:
    spec = spec_of(schema, dsn, {"k": "VARCHAR", "n": "BIGINT"})
    older = opened(host, spec)
    older.transact(documents([{"k": "a", "n": 1}]), {"batch": 1})
    newer = host.runtime(spec)
    assert newer.open() == {"batch": 1}
    with pytest.raises(FencedOff, match="fenced off by another runtime"):
        older.transact(documents([{"k": "a", "n": 100}, {"k": "zombie", "n": 1}]), {"batch": 2})
    older.close()
    assert table_rows(dsn, schema) == [("a", 1)]  # the zombie's transaction left nothing behind
    newer.transact(documents([{"k": "b", "n": 2}]), {"batch": 2})
    newer.close()
    assert table_rows(dsn, schema) == [("a", 1), ("b", 2)]
    assert checkpoints(dsn, schema) == [{"batch": 1}, {"batch": 2}]
    with psycopg.connect(dsn) as conn:
        assert conn.execute(f'SELECT fence, checkpoint FROM "{schema}".headrace_sink_checkpoints').fetchall() == \
            [(2, {"batch": 2})]


def test_a_split_range_inherits_its_parents_checkpoint_and_fences_it(host: HostedDriver, dsn: str,
                                                                    schema: str) -> None:
    spec = spec_of(schema, dsn, {"k": "VARCHAR", "n": "BIGINT"})
    parent = opened(host, spec)
    parent.transact(documents([{"k": "a", "n": 1}]), {"batch": 1})
    child = Runtime(RpcDriverConnection(host.host, host.port, io_timeout=60), spec, key_begin=0, key_end=0x7FFFFFFF)
    assert child.open() == {"batch": 1}
    with pytest.raises(FencedOff):
        parent.transact(documents([{"k": "b", "n": 1}]), {"batch": 2})
    child.transact(documents([{"k": "c", "n": 1}]), {"batch": 2})
    parent.close()
    child.close()
    assert table_rows(dsn, schema) == [("a", 1), ("c", 1)]


class _StopsAt:
    """A DriverConnection that, once armed, stops before sending StartCommit ("stores") or before reading its
    StartedCommit ("start_commit"): it reports and waits to be killed."""

    def __init__(self, connection: RpcDriverConnection, point: str) -> None:
        self._connection = connection
        self._point = point
        self.armed = False

    def send(self, msgs: list[Request]) -> None:
        starts_commit = any(isinstance(m, StartCommit) for m in msgs)
        if self.armed and starts_commit and self._point == "stores":
            self._wait_for_the_kill()
        self._connection.send(msgs)
        if self.armed and starts_commit:
            self._wait_for_the_kill()

    def _wait_for_the_kill(self) -> None:
        print("stopped", flush=True)
        time.sleep(120)

    def recv(self) -> Response:
        return self._connection.recv()

    def close(self) -> None:
        self._connection.close()


def _worker(host: str, port: int, dsn: str, schema: str, point: str) -> None:
    """The runtime process of the kill -9 test: commits batch 1, sends batch 2's Stores (and StartCommit), stops."""
    connection = _StopsAt(RpcDriverConnection(host, port, io_timeout=60), point)
    runtime = Runtime(connection, spec_of(schema, dsn, {"k": "VARCHAR", "n": "BIGINT"}))
    runtime.open()
    runtime.transact(documents([{"k": "a", "n": 1}]), {"batch": 1})
    print("committed", flush=True)
    connection.armed = True
    runtime.transact(documents([{"k": "a", "n": 2}] + [{"k": f"b{i}", "n": 2} for i in range(5000)]), {"batch": 2})


@pytest.mark.parametrize("point", ["stores", "start_commit"])
def test_a_crash_before_started_commit_applies_all_or_nothing(host: HostedDriver, dsn: str, schema: str,
                                                             point: str) -> None:
    """kill -9 of the runtime after its Stores (before StartCommit: nothing may be applied) or after StartCommit
    (before StartedCommit: the commit may or may not land): the next Open's checkpoint says which, exactly."""
    spec = spec_of(schema, dsn, {"k": "VARCHAR", "n": "BIGINT"})
    opened(host, spec).close()
    root = Path(__file__).resolve().parents[3]
    worker = subprocess.Popen([sys.executable, __file__, host.host, str(host.port), dsn, schema, point],
                              stdout=subprocess.PIPE, text=True, cwd=root,
                              env={"PYTHONPATH": f"{root / 'src'}:{root}", "PATH": "/usr/bin:/bin"})
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "committed"
        assert worker.stdout.readline().strip() == "stopped"
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
    runtime = host.runtime(spec)
    checkpoint = runtime.open()
    if point == "stores":
        assert checkpoint == {"batch": 1}  # the last committed checkpoint, and nothing of batch 2
        assert table_rows(dsn, schema) == [("a", 1)]
    else:  # the driver was committing: batch 2 landed whole with its checkpoint, or not at all
        assert checkpoint in ({"batch": 1}, {"batch": 2})
        assert len(table_rows(dsn, schema)) == (1 if checkpoint == {"batch": 1} else 5001)
        assert table_rows(dsn, schema)[0] == ("a", checkpoint["batch"])
    if checkpoint == {"batch": 1}:
        runtime.transact(documents([{"k": "a", "n": 3}]), {"batch": 2})
        assert table_rows(dsn, schema) == [("a", 3)]
    runtime.close()
    assert checkpoints(dsn, schema) == [{"batch": 1}, {"batch": 2}]  # one history row per committed transaction
    with psycopg.connect(dsn) as conn:  # no transaction of the dead runtime's connection lingers
        assert conn.execute("SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%%' "
                            "AND datname = current_database()").fetchone() == (0,)


def test_a_lost_postgresql_connection_fails_the_transaction_and_a_new_runtime_resumes(
        host: HostedDriver, dsn: str, schema: str) -> None:
    spec = spec_of(schema, dsn, {"k": "VARCHAR", "n": "BIGINT"})
    runtime = opened(host, spec)
    runtime.transact(documents([{"k": "a", "n": 1}]), {"batch": 1})
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE application_name = 'headrace-sink'").fetchone() == (1,)
    with pytest.raises(DriverError, match="PostgreSQL sink: (load|commit) failed"):
        runtime.transact(documents([{"k": "a", "n": 2}]), {"batch": 2})
    runtime.close()
    runtime = host.runtime(spec)
    assert runtime.open() == {"batch": 1}
    runtime.transact(documents([{"k": "a", "n": 2}]), {"batch": 2})
    runtime.close()
    assert table_rows(dsn, schema) == [("a", 2)]


def test_the_history_keeps_one_row_per_commit_and_is_pruned(dsn: str, schema: str) -> None:
    with hosted_driver(lambda open: PostgresTransactor(history_limit=3, prune_every=1), PostgresConnector()) as host:
        runtime = opened(host, spec_of(schema, dsn, {"k": "VARCHAR", "n": "BIGINT"}))
        for batch in range(1, 6):
            runtime.transact(documents([{"k": "a", "n": batch}]), {"batch": batch})
            assert checkpoints(dsn, schema) == [{"batch": b} for b in range(max(1, batch - 2), batch + 1)]
        runtime.close()


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
