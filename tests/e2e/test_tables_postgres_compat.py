"""Tables on the PostgreSQL serving store give PostgreSQL's answers (issue 16, docs/tables.md): values assigned by
PostgreSQL (timestamps of any year, +-infinity, float input), tables headrace cannot keep (partitions) left to the
store, TRUNCATE through the log, multiple-column SET, temporary tables that shadow headrace's, scrolling cursors.
Expected values are PostgreSQL 15's own answers to the same statements."""

from __future__ import annotations

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess, wait_for


def _connect(server: HeadraceProcess) -> psycopg.Connection[tuple[object, ...]]:
    conn = psycopg.connect(server.dsn, autocommit=True)
    conn.execute("SET TimeZone = 'UTC'")
    conn.execute("SET DateStyle = 'ISO, MDY'")
    return conn


def _applied(conn: psycopg.Connection[tuple[object, ...]], table: str, count: int) -> None:
    """Wait for a new table's first writes: its streaming query may start slower, on a loaded machine, than one
    read waits for the pipeline (57P03 after 60 s)."""
    def ready() -> bool:
        try:
            return conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (count,)
        except psycopg.errors.CannotConnectNow:
            return False

    wait_for(ready, 240, interval=1.0, message=f"the first writes to {table}")


def test_values_are_assigned_by_postgres(pg_serving_server: HeadraceProcess) -> None:
    with _connect(pg_serving_server) as conn:
        conn.execute("CREATE TABLE compat_times (n int, d timestamp, z timestamptz, a date)")
        conn.execute("INSERT INTO compat_times VALUES (1, 'epoch', 'epoch', 'epoch'), "
                     "(2, 'infinity', 'infinity', 'infinity'), (3, '-infinity', '-infinity', '-infinity'), "
                     "(4, 'Feb 16 17:32:01 0097 BC', 'Feb 16 17:32:01 0097 BC', 'Feb 16 0097 BC'), "
                     "(5, 'Sat Mar 12 23:58:48 10000', 'Sat Mar 12 23:58:48 10000 IST', '10000-03-12'), "
                     "(6, 'Mon Feb 10 17:32:01 1997 PST', 'Mon Feb 10 17:32:01 1997 PST', 'Feb 10 1997')")
        _applied(conn, "compat_times", 6)
        expected = [(1, "1970-01-01 00:00:00", "1970-01-01 00:00:00+00", "1970-01-01"),
                    (2, "infinity", "infinity", "infinity"), (3, "-infinity", "-infinity", "-infinity"),
                    (4, "0097-02-16 17:32:01 BC", "0097-02-16 17:32:01+00 BC", "0097-02-16 BC"),
                    (5, "10000-03-12 23:58:48", "10000-03-12 21:58:48+00", "10000-03-12"),
                    (6, "1997-02-10 17:32:01", "1997-02-11 01:32:01+00", "1997-02-10")]
        assert conn.execute("SELECT n, d::text, z::text, a::text FROM compat_times ORDER BY n").fetchall() == expected
        # rows holding them are read back exactly by a write (UPDATE's current contents), and compared as PostgreSQL
        assert conn.execute("UPDATE compat_times SET n = n + 10 WHERE d = 'infinity' OR a < '0001-01-01'"
                            ).rowcount == 3
        assert conn.execute("SELECT n FROM compat_times WHERE d > '9999-01-01' ORDER BY n").fetchall() == [(5,), (12,)]
        assert conn.execute("DELETE FROM compat_times WHERE z = '-infinity'").rowcount == 1  # n = 13
        assert conn.execute("SELECT count(*) FROM compat_times").fetchone() == (5,)

        conn.execute("CREATE TABLE compat_floats (r real, f float8)")
        conn.execute("INSERT INTO compat_floats VALUES ('   -34.84  ', '1.2345678901234e+200')")
        _applied(conn, "compat_floats", 1)
        assert conn.execute("SELECT r::text, f::text FROM compat_floats").fetchall() == [("-34.84",
                                                                                          "1.2345678901234e+200")]
        with pytest.raises(psycopg.errors.NumericValueOutOfRange) as real:
            conn.execute("INSERT INTO compat_floats VALUES ('10e400', 1)")
        assert str(real.value).startswith('"10e400" is out of range for type real')
        with pytest.raises(psycopg.errors.SyntaxError) as short:  # a column list and fewer values: PostgreSQL's 42601
            conn.execute("INSERT INTO compat_floats (r, f) VALUES (1)")
        assert "more target columns than expressions" in str(short.value)


def test_partitioned_tables_are_the_stores(pg_serving_server: HeadraceProcess) -> None:
    with _connect(pg_serving_server) as conn:
        created = conn.execute("CREATE TABLE compat_parted (a text, b int) PARTITION BY LIST (a)")
        assert created.statusmessage == "CREATE TABLE"
        conn.execute("CREATE TABLE compat_part_x PARTITION OF compat_parted FOR VALUES IN ('x')")
        conn.execute("INSERT INTO compat_parted VALUES ('x', 1)")
        assert conn.execute("SELECT tableoid::regclass::text, * FROM compat_parted").fetchall() == [
            ("compat_part_x", "x", 1)]
        with pytest.raises(psycopg.errors.CheckViolation):  # 23514: PostgreSQL's partition routing
            conn.execute("INSERT INTO compat_parted VALUES ('y', 2)")
        conn.execute("TRUNCATE compat_parted")
        assert conn.execute("SELECT count(*) FROM compat_parted").fetchone() == (0,)


def test_truncate_and_multiple_column_set(pg_serving_server: HeadraceProcess) -> None:
    with _connect(pg_serving_server) as conn:
        conn.execute("CREATE TABLE compat_upd (k int PRIMARY KEY, a int, b int DEFAULT 7, c text)")
        conn.execute("CREATE MATERIALIZED VIEW compat_upd_count AS SELECT count(*) AS n FROM compat_upd")
        conn.execute("INSERT INTO compat_upd VALUES (1, 10, 20, 'foo'), (2, 11, 21, 'bar')")
        _applied(conn, "compat_upd", 2)
        conn.execute("UPDATE compat_upd SET (c, b) = ('car', a + b), a = a + 1 WHERE k = 1")
        conn.execute("UPDATE compat_upd SET (a, b) = (SELECT b, a FROM compat_upd s WHERE s.k = 2) WHERE k = 2")
        conn.execute("UPDATE compat_upd SET (a, b) = ROW(DEFAULT, DEFAULT) WHERE k = 2 RETURNING *")
        assert conn.execute("SELECT * FROM compat_upd ORDER BY k").fetchall() == [(1, 11, 30, "car"),
                                                                                 (2, None, 7, "bar")]
        with pytest.raises(psycopg.errors.SyntaxError):  # 42601, as PostgreSQL
            conn.execute("UPDATE compat_upd SET (a, b) = (SELECT 1)")
        # a form headrace's parser refuses goes to the store, where the session may only read the table
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE compat_upd SET a = 1 FROM (VALUES (1)) AS v(x), (VALUES (2)) AS w(y)")
        wait_for(lambda: conn.execute("SELECT n FROM compat_upd_count").fetchone() == (2,), 120,
                 message="the view over the table")
        truncated = conn.execute("TRUNCATE TABLE compat_upd")
        assert truncated.statusmessage == "TRUNCATE TABLE"
        assert conn.execute("SELECT count(*) FROM compat_upd").fetchone() == (0,)
        wait_for(lambda: conn.execute("SELECT n FROM compat_upd_count").fetchone() == (0,), 120,
                 message="the view after TRUNCATE")  # TRUNCATE went through the log: the view followed
        with pytest.raises(psycopg.errors.WrongObjectType):  # 42809: a view is not a table
            conn.execute("TRUNCATE compat_upd_count")


def test_temporary_tables_shadow_headraces(pg_serving_server: HeadraceProcess) -> None:
    with _connect(pg_serving_server) as conn, _connect(pg_serving_server) as other:
        conn.execute("CREATE TABLE compat_shadow (f1 float8)")
        conn.execute("INSERT INTO compat_shadow VALUES (1.5)")
        _applied(conn, "compat_shadow", 1)
        conn.execute("CREATE TEMP TABLE compat_shadow (f1 float8)")
        conn.execute("INSERT INTO compat_shadow VALUES ('   -34.84  '), (2)")  # into the temporary table
        assert conn.execute("SELECT f1 FROM compat_shadow ORDER BY f1").fetchall() == [(-34.84,), (2.0,)]
        assert other.execute("SELECT f1 FROM compat_shadow").fetchall() == [(1.5,)]  # another session: headrace's
        conn.execute("DROP TABLE compat_shadow")  # the temporary one, as in PostgreSQL
        assert conn.execute("SELECT f1 FROM compat_shadow").fetchall() == [(1.5,)]


def test_cursors_scroll(pg_serving_server: HeadraceProcess) -> None:
    with _connect(pg_serving_server) as conn:
        conn.execute("CREATE TABLE compat_cur (n int PRIMARY KEY)")
        conn.execute("INSERT INTO compat_cur SELECT generate_series(1, 5)")
        _applied(conn, "compat_cur", 5)
        conn.autocommit = False
        cursor = conn.cursor()
        cursor.execute("DECLARE c CURSOR FOR SELECT n FROM compat_cur ORDER BY n LIMIT 10")
        assert cursor.execute("FETCH ALL IN c").fetchall() == [(1,), (2,), (3,), (4,), (5,)]
        assert cursor.execute("FETCH 1 IN c").fetchall() == []
        assert cursor.execute("FETCH BACKWARD 1 IN c").fetchall() == [(5,)]
        assert cursor.execute("FETCH BACKWARD ALL IN c").fetchall() == [(4,), (3,), (2,), (1,)]
        assert cursor.execute("MOVE ABSOLUTE 2 IN c").statusmessage == "MOVE 1"
        assert cursor.execute("FETCH RELATIVE 2 IN c").fetchall() == [(4,)]
        assert cursor.execute("FETCH LAST IN c").fetchall() == [(5,)]
        assert cursor.execute("FETCH PRIOR IN c").fetchall() == [(4,)]
        cursor.execute("DECLARE f NO SCROLL CURSOR FOR SELECT n FROM compat_cur ORDER BY n")
        assert cursor.execute("FETCH 2 FROM f").fetchall() == [(1,), (2,)]
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):  # 55000
            cursor.execute("FETCH BACKWARD 1 FROM f")
        conn.rollback()
