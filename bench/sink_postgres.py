"""Throughput of the POSTGRES sink driver: documents materialized exactly once per second into PostgreSQL 15.

    .venv/bin/python bench/sink_postgres.py [--keys 100000] [--updates 3]

A throwaway PostgreSQL 15 (fsync=on, tests/real_servers/postgres.py) and the driver served by the real connection
loop on localhost TCP (tests/materialize/drivers/conftest.py), driven by a real Runtime. A view-like binding: key
VARCHAR plus 6 value columns (BIGINT count, 2 DOUBLE sums, DECIMAL(18,2), TIMESTAMPTZ, VARCHAR). For the columnar
path (ColumnarDocuments: LoadColumns -> LoadedColumns -> reduce -> StoreColumns, what the sink runner uses) and the
row path (Load/Loaded/Store messages), it times (1) the first transaction, inserting every key, and (2) transactions
updating every key (Load of all keys, reduce, UPDATE ... FROM), each a whole `Runtime.transact` (checkpoint
committed with the rows). The ceiling: a raw COPY of the same rows (CSV prepared beforehand) into the same, empty
table through psycopg, committed; and, for updates, what PostgreSQL alone takes for the driver's statements (COPY
into a temporary table, UPDATE ... FROM, commit), the floor of any update through SQL."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headrace.materialize.columnar import ColumnarDocuments, ColumnarStores  # noqa: E402
from headrace.materialize.drivers.postgres import PostgresConnector, PostgresTransactor  # noqa: E402
from headrace.materialize.drivers.postgres_sql import column, csv_payload, staged_from_arrow  # noqa: E402
from headrace.materialize.protocol import Binding, MaterializationSpec  # noqa: E402
from tests.materialize.drivers.conftest import HostedDriver, hosted_driver  # noqa: E402
from tests.real_servers.postgres import PostgresCluster  # noqa: E402

TYPES = {"k": "VARCHAR", "count": "BIGINT", "sum_a": "DOUBLE", "sum_b": "DOUBLE", "amount": "DECIMAL(18,2)",
         "last_seen": "TIMESTAMPTZ", "label": "VARCHAR"}
_BASE_US = 1_700_000_000_000_000


def spec_for(dsn: str, table: str) -> MaterializationSpec:
    return MaterializationSpec(f"bench_{table}", (Binding(("public", table), ("k",), tuple(TYPES)[1:], TYPES),),
                               config={"url": dsn})


def rows_table(keys: int, round_: int) -> pa.Table:
    """One transaction's documents as columns: every key, values changing with the round."""
    n = pa.array(range(keys), pa.int64())
    return pa.table({
        "k": pa.array([f"key-{i:07d}" for i in range(keys)]),
        "count": pc.add(n, round_),
        "sum_a": pc.multiply(n.cast(pa.float64()), 0.25 + round_),
        "sum_b": pc.divide(n.cast(pa.float64()), 3.0 + round_),
        "amount": pa.array([Decimal(i % 100_000) / 100 + round_ for i in range(keys)], pa.decimal128(18, 2)),
        "last_seen": pc.add(n, _BASE_US + round_ * 1_000_000),  # int64 microseconds (the protocol's convention)
        "label": pa.array([f"label {i % 97} round {round_}" for i in range(keys)]),
    })


def row_documents(table: pa.Table) -> list[tuple[int, list[Any], dict[str, Any]]]:
    columns = {name: table[name].to_pylist() for name in table.column_names}
    columns["amount"] = [str(v) for v in columns["amount"]]
    names = list(columns)
    return [(0, [row[0]], dict(zip(names, row))) for row in zip(*columns.values())]


def last_write_wins(partials: pa.Table, loaded: pa.Table | None) -> ColumnarStores:
    """A sink's reduction: the new row replaces the stored one (an update if the key is stored, else an insert)."""
    if loaded is None or loaded.num_rows == 0:
        return ColumnarStores(rows=partials)
    stored = pc.is_in(partials["k"], value_set=loaded["k"])
    return ColumnarStores(rows=partials.filter(pc.invert(stored)), updated=partials.filter(stored))


def timed_transactions(host: HostedDriver, dsn: str, table: str, keys: int, updates: int,
                       columnar: bool) -> tuple[float, list[float]]:
    """Seconds of the inserting transaction and of each updating one (data prepared outside the timing)."""
    runtime = host.runtime(spec_for(dsn, table))
    runtime.apply()
    runtime.open()
    seconds = []
    for round_ in range(updates + 1):
        table_ = rows_table(keys, round_)
        if columnar:
            batch = [ColumnarDocuments(0, table_, last_write_wins)]
            started = time.perf_counter()
            runtime.transact([], {"round": round_}, columnar=batch)
        else:
            docs = row_documents(table_)
            started = time.perf_counter()
            runtime.transact(docs, {"round": round_})
        seconds.append(time.perf_counter() - started)
        if round_ == 0:
            with psycopg.connect(dsn) as conn:  # planner statistics, as autovacuum would gather soon
                conn.execute(f"ANALYZE {table}")
    runtime.close()
    with psycopg.connect(dsn) as conn:
        assert conn.execute(f"SELECT count(*), sum(count) FROM {table}").fetchone() == \
            (keys, sum(range(keys)) + keys * updates)
    return seconds[0], seconds[1:]


def csv_rows(keys: int, round_: int) -> bytes:
    table = rows_table(keys, round_)
    columns = [column(name, type_name) for name, type_name in TYPES.items()]
    return csv_payload(pa.table({c.name: staged_from_arrow(c, table[c.name]) for c in columns})).to_pybytes()


def copy_seconds(dsn: str, payload: bytes, create_table: str, repeats: int = 3) -> float:
    """The ceiling: COPY of `payload` (CSV prepared beforehand) into a new, empty `raw_copy` made by `create_table`,
    committed (best of `repeats`)."""
    best = float("inf")
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        for _ in range(repeats):
            conn.execute("DROP TABLE IF EXISTS raw_copy")
            conn.execute(create_table)
            conn.commit()
            started = time.perf_counter()
            with conn.cursor().copy("COPY raw_copy FROM STDIN (FORMAT csv)") as copy:
                copy.write(payload)
            conn.commit()
            best = min(best, time.perf_counter() - started)
    return best


def raw_copy_seconds(dsn: str, keys: int, repeats: int = 3) -> float:
    """COPY of the same rows as the driver's, into an empty table of the driver's shape."""
    return copy_seconds(dsn, csv_rows(keys, 0), "CREATE TABLE raw_copy (k text PRIMARY KEY, count bigint, "
                        "sum_a double precision, sum_b double precision, amount numeric(18,2), last_seen timestamptz, "
                        "label text)", repeats)


def raw_update_seconds(dsn: str, keys: int, repeats: int = 3) -> float:
    """What PostgreSQL alone takes to update every row as the driver does (after raw_copy_seconds): COPY of the
    new rows (CSV prepared beforehand) into a temporary table, one UPDATE ... FROM, commit (best of)."""
    payloads = [csv_rows(keys, round_) for round_ in range(1, repeats + 1)]
    best = float("inf")
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TimeZone = 'UTC'; SET work_mem = '64MB'; SET temp_buffers = '256MB'")
        conn.execute("ANALYZE raw_copy")
        conn.execute("CREATE TEMPORARY TABLE staged (LIKE raw_copy) ON COMMIT DELETE ROWS")
        conn.commit()
        for payload in payloads:
            started = time.perf_counter()
            with conn.cursor().copy("COPY staged FROM STDIN (FORMAT csv)") as copy:
                copy.write(payload)
            conn.execute("UPDATE raw_copy AS t SET count = s.count, sum_a = s.sum_a, sum_b = s.sum_b, "
                         "amount = s.amount, last_seen = s.last_seen, label = s.label FROM staged AS s "
                         "WHERE t.k = s.k")
            conn.commit()
            best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--updates", type=int, default=3, help="updating transactions per path")
    args = parser.parse_args()
    keys = args.keys
    with tempfile.TemporaryDirectory(prefix="sink-postgres-") as workdir, \
            PostgresCluster(Path(workdir) / "pg") as cluster:
        dsn = cluster.create_database("bench")
        raw = raw_copy_seconds(dsn, keys)
        raw_rate = keys / raw
        print(f"raw COPY of {keys:,} rows into an empty table (psycopg, committed): {raw_rate:,.0f} rows/s "
              f"({raw * 1000:.0f} ms)")
        raw_update = raw_update_seconds(dsn, keys)
        print(f"raw update of {keys:,} rows (COPY into a temporary table + UPDATE ... FROM, committed): "
              f"{keys / raw_update:,.0f} rows/s ({raw_update * 1000:.0f} ms)")
        with hosted_driver(PostgresTransactor.factory, PostgresConnector()) as host:
            for label, table, columnar in (("columnar", "sink_columnar", True), ("row", "sink_rows", False)):
                insert, updates = timed_transactions(host, dsn, table, keys, args.updates, columnar)
                update = statistics.median(updates)
                print(f"{label:8} path, insert {keys:,} keys: {keys / insert:,.0f} docs/s ({insert * 1000:.0f} ms, "
                      f"{keys / insert / raw_rate:.0%} of raw COPY)")
                print(f"{label:8} path, update {keys:,} keys: {keys / update:,.0f} docs/s (median of "
                      f"{len(updates)}: {update * 1000:.0f} ms, {keys / update / raw_rate:.0%} of raw COPY, "
                      f"{raw_update / update:.0%} of raw update; "
                      f"each: {', '.join(f'{s * 1000:.0f}' for s in updates)} ms)")


if __name__ == "__main__":
    main()
