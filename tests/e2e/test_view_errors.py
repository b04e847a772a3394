"""Errors are data (issue 22): a row whose view expression fails is an error of that view, not a stalled pipeline.

One table with views that fail on one row (an integer cast out of range, a division by zero) and views that do not:
the table and the good views stay fresh, a SELECT of a failing view answers the row's error with the SQLSTATE and
message a real PostgreSQL 15 gives for the same SELECT, headrace_internal.view_errors lists it, and deleting the row
or updating it to a value the view can compute brings the view back with the right rows. Both the stream (a view
existing before the row) and the backfill (a view created after it) are covered, a webhook source, the PostgreSQL
serving store, and a kill -9 right after the commit holding an error."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess, wait_for
from tests.e2e.server_process import select_after_cold_start as read
from tests.e2e.webhook_client import post_webhook
from tests.real_servers.postgres import shared_cluster

pytestmark = pytest.mark.e2e


def fresh(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def postgres() -> Iterator[psycopg.Connection]:
    """A database of the shared PostgreSQL 15 cluster: the truth for errors' SQLSTATEs and messages."""
    with psycopg.connect(shared_cluster().create_database(fresh("view_errors")), autocommit=True) as conn:
        yield conn


def error_of(conn: psycopg.Connection, sql: str) -> tuple[str | None, str | None]:
    with pytest.raises(psycopg.Error) as caught:
        read(conn, sql)
    return caught.value.sqlstate, caught.value.diag.message_primary


def test_a_failing_row_is_an_error_of_its_view_while_the_table_and_other_views_flow(
        server: HeadraceProcess, postgres: psycopg.Connection) -> None:
    table = fresh("ve")
    good, cast, div, late = (f"{table}_{suffix}" for suffix in ("good", "cast", "div", "late"))
    cast_sql = f"SELECT id, (v * 100000000)::int AS x FROM {table}"
    div_sql = f"SELECT region, sum(100 / d) AS q FROM {table} GROUP BY region"
    late_sql = f"SELECT id, CASE WHEN v > 0 THEN v * 100000000 ELSE 0 END::int AS x FROM {table} WHERE region <> 'x'"
    ddl = f"CREATE TABLE {table} (id int PRIMARY KEY, region text NOT NULL, v int8, d int)"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(ddl)
        postgres.execute(ddl)

        def write(sql: str) -> None:
            conn.execute(sql)
            postgres.execute(sql)

        conn.execute(f"CREATE MATERIALIZED VIEW {good} AS SELECT region, count(*) AS n, sum(v) AS total "
                     f"FROM {table} GROUP BY region")
        conn.execute(f"CREATE MATERIALIZED VIEW {cast} AS {cast_sql}")
        conn.execute(f"CREATE MATERIALIZED VIEW {div} AS {div_sql}")
        write(f"INSERT INTO {table} VALUES (1, 'eu', 10, 1), (2, 'eu', 20, 2), (3, 'us', 5, 1)")
        assert read(conn, f"SELECT id, x FROM {cast} ORDER BY id") == [(1, 1000000000), (2, 2000000000),
                                                                         (3, 500000000)]

        # Row 4 fails both views: v * 1e8 is out of int4's range, 100 / 0 divides by zero.
        write(f"INSERT INTO {table} VALUES (4, 'us', 30, 0)")
        started = time.monotonic()
        assert read(conn, f"SELECT region, n, total FROM {good} ORDER BY region") == [("eu", 2, 30), ("us", 2, 35)]
        assert read(conn, f"SELECT count(*) FROM {table}") == [(4,)]  # the table itself keeps flowing
        assert time.monotonic() - started < 60
        for view, sql in ((cast, cast_sql), (div, div_sql)):
            expected = error_of(postgres, sql)
            assert expected[0] in ("22003", "22012")
            assert error_of(conn, f"SELECT * FROM {view}") == expected
        assert error_of(conn, f"SELECT x FROM {cast} WHERE id = 1") == ("22003", "integer out of range")
        errors = read(conn, "SELECT view_name, key, sqlstate, message FROM headrace_internal.view_errors "
                            f"WHERE view_name LIKE '{table}%' ORDER BY view_name")
        assert errors == [(cast, "[4]", "22003", "integer out of range"), (div, "[4]", "22012", "division by zero")]

        # A view created over the failing row (backfilled) holds the error from its first transaction.
        conn.execute(f"CREATE MATERIALIZED VIEW {late} AS {late_sql}")
        assert error_of(conn, f"SELECT * FROM {late}") == error_of(postgres, late_sql) == \
            ("22003", "integer out of range")

        # Other rows keep flowing into the good view while the errors are live.
        write(f"INSERT INTO {table} VALUES (5, 'eu', 1, 1)")
        assert read(conn, f"SELECT region, n, total FROM {good} ORDER BY region") == [("eu", 3, 31), ("us", 2, 35)]

        # UPDATE to a value the cast can compute: the cast views recover; the division still fails on d = 0.
        write(f"UPDATE {table} SET v = 3 WHERE id = 4")
        for view, sql in ((cast, cast_sql), (late, late_sql)):
            assert read(conn, f"SELECT id, x FROM {view} ORDER BY id") == postgres.execute(
                f"{sql} ORDER BY id").fetchall()
        assert error_of(conn, f"SELECT * FROM {div}") == ("22012", "division by zero")
        write(f"UPDATE {table} SET d = 4 WHERE id = 4")
        assert read(conn, f"SELECT region, q FROM {div} ORDER BY region") == postgres.execute(
            f"{div_sql} ORDER BY region").fetchall()

        # A new failing row, then DELETE of it: the view recovers with the right rows.
        write(f"INSERT INTO {table} VALUES (6, 'us', 99, 0)")
        assert error_of(conn, f"SELECT * FROM {div}")[0] == "22012"
        assert error_of(conn, f"SELECT * FROM {cast}")[0] == "22003"
        write(f"DELETE FROM {table} WHERE id = 6")
        assert read(conn, f"SELECT region, q FROM {div} ORDER BY region") == postgres.execute(
            f"{div_sql} ORDER BY region").fetchall()
        assert read(conn, f"SELECT id, x FROM {cast} ORDER BY id") == postgres.execute(
            f"{cast_sql} ORDER BY id").fetchall()
        assert read(conn, f"SELECT region, n, total FROM {good} ORDER BY region") == postgres.execute(
            f"SELECT region, count(*), sum(v) FROM {table} GROUP BY region ORDER BY region").fetchall()
        assert read(conn, "SELECT count(*) FROM headrace_internal.view_errors "
                          f"WHERE view_name LIKE '{table}%'") == [(0,)]

        # DROP of a view holding an error takes its errors with it.
        write(f"INSERT INTO {table} VALUES (7, 'eu', 50, 1)")
        assert error_of(conn, f"SELECT * FROM {cast}")[0] == "22003"
        conn.execute(f"DROP MATERIALIZED VIEW {cast}")
        assert read(conn, "SELECT count(*) FROM headrace_internal.view_errors "
                          f"WHERE view_name LIKE '{table}%'") == [(1,)]  # the late view's, on row 7
        conn.execute(f"DROP TABLE {table} CASCADE")


def test_a_webhook_source_keeps_flowing_past_rows_its_view_cannot_compute(
        server: HeadraceProcess, postgres: psycopg.Connection) -> None:
    source = fresh("vesrc")
    counts, sums, texts, numbers = (f"{source}_{suffix}" for suffix in ("counts", "sums", "texts", "numbers"))
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SOURCE {source} FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id')")
        conn.execute(f"CREATE MATERIALIZED VIEW {counts} AS SELECT body->>'k' AS k, count(*) AS n FROM {source} "
                     "GROUP BY 1")
        conn.execute(f"CREATE MATERIALIZED VIEW {sums} AS SELECT body->>'k' AS k, sum((body->>'n')::int) AS s "
                     f"FROM {source} GROUP BY 1")
        # a view over a view: the downstream one fails on a row its upstream shows (derived in the same transaction)
        conn.execute(f"CREATE MATERIALIZED VIEW {texts} AS SELECT body->>'id' AS id, body->>'n' AS n FROM {source}")
        conn.execute(f"CREATE MATERIALIZED VIEW {numbers} AS SELECT id, n::int AS v FROM {texts}")
        url = server.webhook_url(source)

        def post(**body: object) -> None:
            assert post_webhook(url, json.dumps(body).encode()).status_code == 200

        post(id="a", k="x", n="5")
        wait_for(lambda: read(conn, f"SELECT k, s FROM {sums}") == [("x", 5)], 120, message="the first row")
        post(id="b", k="x", n="99999999999")  # out of int4's range
        post(id="c", k="y", n="abc")  # no integer at all
        wait_for(lambda: read(conn, f"SELECT k, n FROM {counts} ORDER BY k") == [("x", 2), ("y", 1)], 120,
                 message="the source and its other view flowing past the failing rows")
        assert read(conn, f"SELECT count(*) FROM {source}") == [(3,)]
        expected = {error_of(postgres, f"SELECT '{text}'::int") for text in ("99999999999", "abc")}
        assert expected == {("22003", 'value "99999999999" is out of range for type integer'),
                            ("22P02", 'invalid input syntax for type integer: "abc"')}
        assert error_of(conn, f"SELECT * FROM {sums}") in expected
        listed = read(conn, f"SELECT sqlstate, message FROM headrace_internal.view_errors WHERE view_name = '{sums}'")
        assert set(listed) == expected
        assert read(conn, f"SELECT id, n FROM {texts} ORDER BY id") == [("a", "5"), ("b", "99999999999"), ("c", "abc")]
        assert error_of(conn, f"SELECT * FROM {numbers}") in expected

        post(id="b", k="x", n="7")  # replacements (same IDEMPOTENT key) retract the failing versions
        post(id="c", k="y", n="1")
        wait_for(lambda: _answers(conn, f"SELECT k, s FROM {sums} ORDER BY k") == [("x", 12), ("y", 1)], 120,
                 message="the view recovering once its failing rows are replaced")
        assert read(conn, f"SELECT count(*) FROM headrace_internal.view_errors WHERE view_name = '{sums}'") == [(0,)]
        assert read(conn, f"SELECT k, n FROM {counts} ORDER BY k") == [("x", 2), ("y", 1)]
        assert read(conn, f"SELECT id, v FROM {numbers} ORDER BY id") == [("a", 5), ("b", 7), ("c", 1)]
        conn.execute(f"DROP SOURCE {source} CASCADE")


def _answers(conn: psycopg.Connection, sql: str) -> list[tuple[object, ...]] | None:
    try:
        return read(conn, sql)
    except psycopg.DataError:
        return None


def test_errors_on_the_postgres_serving_store(pg_serving_server: HeadraceProcess, postgres: psycopg.Connection) -> None:
    """The same on HEADRACE_SERVING_STORE=postgres: the view's read, headrace_internal.view_errors, recovery."""
    table = fresh("vepg")
    view = f"{table}_cast"
    view_sql = f"SELECT id, (v * 100000000)::int AS x FROM {table}"
    ddl = f"CREATE TABLE {table} (id int PRIMARY KEY, v int8)"
    with psycopg.connect(pg_serving_server.dsn, autocommit=True) as conn:
        conn.execute(ddl)
        postgres.execute(ddl)
        conn.execute(f"CREATE MATERIALIZED VIEW {view} AS {view_sql}")
        for sql in (f"INSERT INTO {table} VALUES (1, 10), (2, 30)", ):
            conn.execute(sql)
            postgres.execute(sql)
        assert read(conn, f"SELECT count(*) FROM {table}") == [(2,)]
        assert error_of(conn, f"SELECT * FROM {view}") == error_of(postgres, view_sql) == \
            ("22003", "integer out of range")
        assert read(conn, "SELECT view_name, key, sqlstate FROM headrace_internal.view_errors "
                          f"WHERE view_name = '{view}'") == [(view, "[2]", "22003")]
        conn.execute(f"DELETE FROM {table} WHERE id = 2")
        assert read(conn, f"SELECT id, x FROM {view}") == [(1, 1000000000)]
        conn.execute(f"DROP TABLE {table} CASCADE")


@pytest.mark.timeout(900)
def test_an_error_survives_kill_9_right_after_its_commit_exactly_once(tmp_path: Path) -> None:
    """kill -9 between the StartedCommit of the transaction holding a view's error and the next Acknowledge (the fail
    point of tests/e2e/test_view_faults.py): Spark replays that batch after the restart, the store's checkpoint skips
    it, and the error is there once; deleting the row then clears it."""
    process = HeadraceProcess(tmp_path / "data")
    try:
        process.start(env={"HEADRACE_FAILPOINTS": "after_started_commit:2"})
        with psycopg.connect(process.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int8)")
            conn.execute("CREATE MATERIALIZED VIEW total AS SELECT count(*) AS n, sum(v) AS s FROM t")
            conn.execute("CREATE MATERIALIZED VIEW scaled AS SELECT id, (v * 100000000)::int AS x FROM t")
            conn.execute("INSERT INTO t VALUES (1, 1), (2, 2)")  # commit 1
            assert read(conn, "SELECT n, s FROM total") == [(2, 3)]
            conn.execute("INSERT INTO t VALUES (3, 300)")  # commit 2 holds the error; the fail point fires after it
        assert process.process is not None
        process.process.wait(timeout=300)
        assert process.process.returncode == -9, process.output()[-3000:]

        process.start()
        with psycopg.connect(process.dsn, autocommit=True) as conn:
            assert read(conn, "SELECT n, s FROM total") == [(3, 303)]
            assert error_of(conn, "SELECT * FROM scaled") == ("22003", "integer out of range")
            assert read(conn, "SELECT view_name, key, sqlstate FROM headrace_internal.view_errors") == [
                ("scaled", "[3]", "22003")]
            conn.execute("DELETE FROM t WHERE id = 3")
            assert read(conn, "SELECT id, x FROM scaled ORDER BY id") == [(1, 100000000), (2, 200000000)]
            assert read(conn, "SELECT count(*) FROM headrace_internal.view_errors") == [(0,)]
            assert read(conn, "SELECT n, s FROM total") == [(2, 3)]
    finally:
        process.stop()


def test_an_error_arriving_later_ends_a_subscribe_and_fails_index_lookups_and_insert_select(
        server: HeadraceProcess) -> None:
    """The limits of the first version, closed: a running SUBSCRIBE of the view ends with the error when it arrives
    (as a SELECT fails), a point lookup on the view's index (pgwire's direct lane once prepared) fails with it rather
    than answering, and so does an INSERT ... SELECT from the view; after the row is deleted all of them answer."""
    table = fresh("vlate")
    view, copy = f"{table}_cast", f"{table}_copy"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int8)")
        conn.execute(f"CREATE TABLE {copy} (id int PRIMARY KEY, x int)")
        conn.execute(f"CREATE MATERIALIZED VIEW {view} AS SELECT id, (v * 100000000)::int AS x FROM {table}")
        conn.execute(f"CREATE INDEX {view}_id ON {view} (id)")
        conn.execute(f"INSERT INTO {table} VALUES (1, 1)")
        assert read(conn, f"SELECT x FROM {view} WHERE id = 1") == [(100000000,)]
        lookup = f"SELECT x FROM {view} WHERE id = %s"
        for _ in range(3):  # prepared after a few runs: then pgwire's direct lane answers it
            assert conn.execute(lookup, (1,), prepare=True).fetchall() == [(100000000,)]

        rows: list[tuple[object, ...]] = []
        with psycopg.connect(server.dsn, autocommit=True) as subscriber:
            with pytest.raises(psycopg.Error) as ended:
                for row in subscriber.cursor().stream(f"SUBSCRIBE {view}"):
                    rows.append(row)
                    if len(rows) == 1:
                        conn.execute(f"INSERT INTO {table} VALUES (2, 30)")  # 30 * 1e8 is beyond int4
            assert (ended.value.sqlstate, ended.value.diag.message_primary) == ("22003", "integer out of range")
        assert [row[1:] for row in rows] == [(1, 1, 100000000)]

        for statement, params in ((lookup, (1,)), (f"INSERT INTO {copy} SELECT id, x FROM {view}", None)):
            with pytest.raises(psycopg.Error) as caught:
                conn.execute(statement, params, prepare=params is not None)
            assert caught.value.sqlstate == "22003", statement
        assert read(conn, f"SELECT count(*) FROM {copy}") == [(0,)]

        conn.execute(f"DELETE FROM {table} WHERE id = 2")
        assert read(conn, f"SELECT x FROM {view} WHERE id = 1") == [(100000000,)]
        assert conn.execute(lookup, (1,), prepare=True).fetchall() == [(100000000,)]
        conn.execute(f"INSERT INTO {copy} SELECT id, x FROM {view}")
        assert read(conn, f"SELECT id, x FROM {copy}") == [(1, 100000000)]
        conn.execute(f"DROP TABLE {table} CASCADE")
