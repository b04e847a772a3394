"""Sinks end to end (issue 6): CREATE CONNECTION / SINK over pgwire on a real server, into a real PostgreSQL 15, a
real Redis, Parquet files read back with pyarrow and DuckDB, an HTTP endpoint (headrace's own webhook source with
IDEMPOTENT on the Idempotency-Key header), and an external driver started from a command. Each target must end
equal to its relation as headrace shows it, after inserts, updates and deletes."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pyarrow.dataset as ds
import pytest
import redis

from tests.e2e.server_process import HeadraceProcess, wait_for
from tests.real_servers.postgres import PostgresCluster
from tests.real_servers.redis import RedisServer, redis_server  # noqa: F401 - a fixture

pytestmark = pytest.mark.e2e
REPOSITORY = Path(__file__).resolve().parents[2]


JSONL_DRIVER_COMMAND = f"{sys.executable} {REPOSITORY / 'examples/drivers/jsonl/driver.py'}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HeadraceProcess]:
    """A server of this module's own: PARQUET and EXTERNAL (COMMAND) sinks need the allow-lists (issue 20). The
    tests' directories are under pytest's base directory; the data directory too, which the server refuses."""
    process = HeadraceProcess(Path(tmp_path_factory.mktemp("sinks-server")) / "data",
                              ["--allow-directory", str(tmp_path_factory.getbasetemp()),
                               "--allow-command", JSONL_DRIVER_COMMAND])
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with PostgresCluster(tmp_path_factory.mktemp("sink-pg")) as cluster:
        yield cluster.create_database("sinks")


@pytest.fixture(scope="module")
def sql(server: HeadraceProcess) -> Iterator[Any]:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        def run(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []
        run.conn = conn  # type: ignore[attr-defined]
        yield run


def normalized(rows: Any) -> list[tuple[Any, ...]]:
    """Rows compared by value: integers-as-decimals and floats made comparable, sorted."""
    def value(item: Any) -> Any:
        if isinstance(item, Decimal):
            return int(item) if item == item.to_integral_value() else float(item)
        return item
    return sorted(tuple(value(item) for item in row) for row in rows)


def sink_state(sql: Any, name: str) -> tuple[Any, ...]:
    rows = sql("SELECT state, position, transactions, documents, lag_transactions, last_error "
               "FROM headrace_internal.sink_status WHERE name = %s", [name])
    assert rows, f"sink {name} is not in sink_status"
    return rows[0]


def test_postgres_sink_follows_a_grouped_view_through_inserts_updates_and_deletes(sql: Any, postgres: str) -> None:
    sql("CREATE TABLE orders (id int PRIMARY KEY, region text, amount numeric(10,2))")
    sql("INSERT INTO orders SELECT i, 'r' || (i % 5), i * 1.25 FROM generate_series(1, 200) AS s(i)")
    sql("CREATE MATERIALIZED VIEW by_region AS SELECT region, count(*) AS n, sum(amount) AS total, "
        "max(amount) AS top FROM orders GROUP BY region")
    sql(f"CREATE SECRET pg_sinks_url AS '{postgres}'")
    sql("CREATE CONNECTION pg_sinks TO POSTGRES (URL = SECRET pg_sinks_url)")
    sql("CREATE SINK by_region_pg FROM by_region INTO POSTGRES (CONNECTION pg_sinks, TABLE 'analytics.by_region')")
    target = psycopg.connect(postgres, autocommit=True)

    def converged() -> bool:
        try:
            view = sql("SELECT region, n, total, top FROM by_region")
        except psycopg.errors.CannotConnectNow:  # the pipeline (starting up under load) has not applied the writes yet
            return False
        return normalized(target.execute("SELECT region, n, total, top FROM analytics.by_region").fetchall()) == \
            normalized(view)

    wait_for(converged, 90, message="the PostgreSQL table equals the view")
    # the key is the GROUP BY column, the PostgreSQL primary key
    key = target.execute("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND "
                         "a.attnum = ANY(i.indkey) WHERE i.indrelid = 'analytics.by_region'::regclass "
                         "AND i.indisprimary").fetchall()
    assert key == [("region",)]
    sql("UPDATE orders SET amount = amount + 1 WHERE id % 3 = 0")
    sql("DELETE FROM orders WHERE region = 'r4'")
    sql("INSERT INTO orders VALUES (1000, 'r9', 9.99)")
    wait_for(converged, 90, message="updates, a deleted group and a new group reached PostgreSQL")
    assert not target.execute("SELECT 1 FROM analytics.by_region WHERE region = 'r4'").fetchall()
    # one history row per committed transaction, none twice
    uptos = [row[0] for row in target.execute(
        "SELECT (checkpoint->>'upto')::bigint FROM analytics.headrace_sink_transactions ORDER BY committed_at")]
    assert len(uptos) == len(set(uptos)) and uptos == sorted(uptos) and len(uptos) >= 2
    state, position, transactions, documents, lag, error = sink_state(sql, "by_region_pg")
    assert state == "running" and error is None and position is not None and transactions >= 2 and documents > 0
    assert ("by_region_pg", "POSTGRES", "public.by_region", "running", "exactly once") in sql("SHOW SINKS")
    assert ("pg_sinks", "postgres") in sql("SHOW CONNECTIONS")
    target.close()


def test_parquet_sink_is_one_dataset_for_pyarrow_and_duckdb(sql: Any, tmp_path: Path) -> None:
    sql("CREATE TABLE readings (sensor text PRIMARY KEY, reading double precision, ok boolean)")
    sql("INSERT INTO readings SELECT 's' || i, i / 4.0, i % 2 = 0 FROM generate_series(1, 300) AS s(i)")
    directory = tmp_path / "readings"
    sql(f"CREATE SINK readings_pq FROM readings INTO PARQUET (PATH '{directory}', BUCKETS 4)")
    sql("UPDATE readings SET reading = -1 WHERE sensor IN ('s1', 's2')")
    sql("DELETE FROM readings WHERE sensor = 's3'")

    def files() -> list[tuple[Any, ...]]:
        return normalized(duckdb.sql(f"SELECT sensor, reading, ok FROM read_parquet('{directory}/*.parquet')")
                          .fetchall())

    expected = normalized(sql("SELECT sensor, reading, ok FROM readings"))
    wait_for(lambda: files() == expected, 90, message="the Parquet files equal the table")
    table = ds.dataset(str(directory), format="parquet").to_table()
    assert normalized(zip(*(table[name].to_pylist() for name in ("sensor", "reading", "ok")))) == expected
    manifest = json.loads((directory / "_manifest.json").read_text())
    assert manifest, "the manifest records the applied transactions"


def test_redis_sink_asks_for_an_opt_in_for_aggregates_and_writes_full_rows(sql: Any,
                                                                          redis_server: RedisServer) -> None:  # noqa: F811
    db = redis_server.fresh_db()
    sql("CREATE TABLE visits (page text PRIMARY KEY, hits bigint)")
    sql("INSERT INTO visits VALUES ('home', 3), ('about', 1)")
    sql("CREATE MATERIALIZED VIEW visit_totals AS SELECT page, sum(hits) AS hits FROM visits GROUP BY page")
    sql(f"CREATE CONNECTION cache TO REDIS (URL = '{redis_server.url(db)}')")
    with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
        sql("CREATE SINK totals_redis FROM visit_totals INTO REDIS (CONNECTION cache)")
    assert "AT LEAST ONCE" in (refused.value.diag.message_hint or "")
    notices: list[str] = []
    sql.conn.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
    sql("CREATE SINK totals_redis FROM visit_totals INTO REDIS (CONNECTION cache, KEY PREFIX 'totals:') "
        "WITH (AT LEAST ONCE)")
    assert any("at least once" in notice for notice in notices)
    client = redis.Redis.from_url(redis_server.url(db), decode_responses=True)
    wait_for(lambda: client.hgetall("totals:home") == {"page": "home", "hits": "3"}, 90, message="hash written")
    sql("UPDATE visits SET hits = 10 WHERE page = 'home'")
    sql("DELETE FROM visits WHERE page = 'about'")
    wait_for(lambda: client.hgetall("totals:home").get("hits") == "10" and not client.exists("totals:about"), 30,
             message="update and delete reached Redis")
    assert sink_state(sql, "totals_redis")[0] == "running"


def test_http_sink_into_an_idempotent_webhook_source_counts_each_change_once(sql: Any,
                                                                           server: HeadraceProcess) -> None:
    sql("CREATE SOURCE inbox FROM WEBHOOK BODY FORMAT JSON ARRAY INCLUDE HEADER 'idempotency-key' AS ikey "
        "IDEMPOTENT (ikey)")
    sql("CREATE TABLE stock (sku text PRIMARY KEY, qty int)")
    sql("INSERT INTO stock VALUES ('a', 1), ('b', 2), ('c', 3)")
    with pytest.raises(psycopg.errors.FeatureNotSupported):
        sql(f"CREATE SINK stock_http FROM stock INTO HTTP (URL '{server.webhook_url('inbox')}')")
    sql(f"CREATE SINK stock_http FROM stock INTO HTTP (URL '{server.webhook_url('inbox')}', BATCH SIZE 1, "
        "HEADERS ('X-Sender' = 'headrace')) WITH (DELTA UPDATES)")
    # The sink starts from a snapshot of the table as its pipeline last committed it: changes made before that
    # commit are in the snapshot, not sent one by one. Change rows once the snapshot is sent.
    wait_for(lambda: sink_state(sql, "stock_http")[2] >= 1, 90, message="the snapshot sent")
    sql("UPDATE stock SET qty = 20 WHERE sku = 'b'")
    sql("DELETE FROM stock WHERE sku = 'c'")
    # 3 snapshot rows, then -1/+1 for b's update and -1 for c: 6 changes, each its own POST (BATCH SIZE 1)
    wait_for(lambda: sql("SELECT count(*) FROM inbox")[0][0] == 6, 90, message="six changes received")
    received = normalized((row[0]["sku"], row[0]["qty"], row[0]["hr_diff"])
                          for row in sql("SELECT body FROM inbox"))
    assert received == normalized([("a", 1, 1), ("b", 2, 1), ("c", 3, 1), ("b", 2, -1), ("b", 20, 1), ("c", 3, -1)])
    keys = [row[0] for row in sql("SELECT ikey FROM inbox")]
    assert len(set(keys)) == 6 and all(key.startswith("sink_") for key in keys)


def test_external_driver_from_a_command(sql: Any, tmp_path: Path) -> None:
    sql("CREATE TABLE notes (id int PRIMARY KEY, body text)")
    sql("INSERT INTO notes VALUES (1, 'one'), (2, 'two')")
    command = JSONL_DRIVER_COMMAND
    config = json.dumps({"directory": str(tmp_path)})
    sql(f"CREATE SINK notes_out FROM notes INTO EXTERNAL (COMMAND '{command}', CONFIG '{config}', "
        "RESOURCE 'notes')")
    sql("UPDATE notes SET body = 'TWO' WHERE id = 2")
    sql("INSERT INTO notes VALUES (3, 'three')")

    def lines() -> list[tuple[Any, ...]]:
        path = tmp_path / "notes.jsonl"
        if not path.exists():
            return []
        documents = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return sorted((doc["id"], doc["body"]) for doc in documents)

    wait_for(lambda: lines() == [(1, "one"), (2, "TWO"), (3, "three")], 90, message="the JSON Lines file")


def test_sink_statements_refuse_what_cannot_work(sql: Any, postgres: str) -> None:
    sql("CREATE TABLE sink_guarded (id int PRIMARY KEY, v int)")
    sql("CREATE MATERIALIZED VIEW sink_guarded_sum AS SELECT id, sum(v) AS v FROM sink_guarded GROUP BY id")
    sql(f"CREATE SECRET guard_url AS '{postgres}'")
    sql("CREATE CONNECTION guard_pg TO POSTGRES (URL = SECRET guard_url)")
    with pytest.raises(psycopg.errors.UndefinedTable):
        sql("CREATE SINK nowhere FROM no_such_view INTO POSTGRES (CONNECTION guard_pg)")
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        sql("CREATE SINK bad FROM sink_guarded_sum INTO POSTGRES (CONNECTION guard_pg, COLOR 'red')")
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        sql("CREATE SINK bad FROM sink_guarded_sum INTO PARQUET (BUCKETS 2)")  # PATH is required
    with pytest.raises(psycopg.errors.UndefinedObject):
        sql("CREATE SINK bad FROM sink_guarded_sum INTO POSTGRES (CONNECTION no_such_connection)")
    with pytest.raises(psycopg.Error) as unreachable:
        sql("CREATE CONNECTION dead_pg TO POSTGRES (URL = 'postgresql://nobody@127.0.0.1:1/none')")
        sql("CREATE SINK bad FROM sink_guarded_sum INTO POSTGRES (CONNECTION dead_pg)")
    assert "127.0.0.1:1" not in str(unreachable.value) or "nobody" not in str(unreachable.value)
    assert not [row for row in sql("SHOW SINKS") if row[0] == "bad"]
    sql("CREATE SINK sink_guarded_pg FROM sink_guarded_sum INTO POSTGRES (CONNECTION guard_pg)")
    with pytest.raises(psycopg.errors.DuplicateObject):
        sql("CREATE SINK sink_guarded_pg FROM sink_guarded_sum INTO POSTGRES (CONNECTION guard_pg)")
    sql("CREATE SINK IF NOT EXISTS sink_guarded_pg FROM sink_guarded_sum INTO POSTGRES (CONNECTION guard_pg)")
    # sources, tables, views and sinks share one namespace
    for clash in ("CREATE SOURCE sink_guarded FROM WEBHOOK BODY FORMAT JSON",
                  "CREATE MATERIALIZED VIEW sink_guarded_pg AS SELECT id FROM sink_guarded",
                  "CREATE TABLE sink_guarded_sum (id int)"):
        with pytest.raises(psycopg.errors.DuplicateTable):
            sql(clash)
    with pytest.raises(psycopg.errors.DependentObjectsStillExist):
        sql("DROP MATERIALIZED VIEW sink_guarded_sum")
    with pytest.raises(psycopg.errors.DependentObjectsStillExist):
        sql("DROP TABLE sink_guarded")
    with pytest.raises(psycopg.errors.DependentObjectsStillExist):
        sql("DROP CONNECTION guard_pg")
    with pytest.raises(psycopg.errors.DependentObjectsStillExist):
        sql("DROP SECRET guard_url")
    sql("DROP MATERIALIZED VIEW sink_guarded_sum CASCADE")
    assert not [row for row in sql("SHOW SINKS") if row[0] == "sink_guarded_pg"]
    sql("DROP CONNECTION guard_pg")
    sql("DROP CONNECTION dead_pg")
    sql("DROP SECRET guard_url")
    sql("DROP SINK IF EXISTS sink_guarded_pg")
    with pytest.raises(psycopg.errors.UndefinedObject):
        sql("DROP SINK sink_guarded_pg")
    sql("DROP TABLE sink_guarded")
