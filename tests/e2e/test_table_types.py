"""Tables with numeric, date, timestamp, uuid and interval columns, DEFAULTs and INSERT ... ON CONFLICT, against a
real server with real clients: psycopg (text and binary parameters, COPY text and csv) and asyncpg (binary
parameters and results), SELECT back with PostgreSQL's OIDs, a CREATE INDEX point lookup, and materialized
views over such a table maintained by the pipeline (GROUP BY a date, min/max of a timestamp)."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from decimal import Decimal

import asyncpg
import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess
from tests.e2e.server_process import select_after_cold_start
from tests.e2e.test_tables import fresh, pipeline_warm  # noqa: F401 - module fixture

pytestmark = pytest.mark.e2e

OIDS = {"id": 2950, "amount": 1700, "raw": 1700, "day": 1082, "at": 1114, "span": 1186}


def create(conn: psycopg.Connection, name: str) -> None:
    conn.execute(f"CREATE TABLE {name} (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), "
                 "amount numeric(12,2) NOT NULL DEFAULT 0, raw numeric, day date DEFAULT current_date, "
                 "at timestamp, span interval)")


def test_exact_types_with_psycopg_text_binary_and_copy(server: HeadraceProcess) -> None:
    name = fresh("typed")
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        create(conn, name)
        conn.execute(f"INSERT INTO {name} (amount, raw, day, at, span) VALUES "
                     "(1.005, 0.1, '2024-02-29', '2024-02-29 10:00:00.5', '1 day 02:00')")
        known = uuid.uuid4()
        values = (known, Decimal("12.34"), Decimal("0.2"), datetime.date(2024, 3, 1),
                  datetime.datetime(2024, 3, 1, 1, 2, 3), datetime.timedelta(hours=5))
        conn.execute(f"INSERT INTO {name} VALUES (%s, %s, %s, %s, %s, %s)", values)
        conn.execute(f"INSERT INTO {name} (amount, raw) VALUES (%b, %b)", (Decimal("-7.5"), Decimal("3")))
        with conn.cursor().copy(f"COPY {name} (amount, day, at, span) FROM STDIN") as copy:
            copy.write_row((Decimal("9.99"), datetime.date(2023, 1, 1), datetime.datetime(2023, 1, 1),
                            datetime.timedelta(minutes=3)))
        with conn.cursor().copy(f"COPY {name} (amount, day) FROM STDIN WITH (FORMAT csv)") as copy:
            copy.write(b"1.50,2022-12-31\n")

        cursor = conn.execute(f"SELECT * FROM {name} ORDER BY amount")
        assert {d.name: d.type_code for d in cursor.description} == OIDS
        rows = cursor.fetchall()
        assert [r[1] for r in rows] == [Decimal("-7.50"), Decimal("1.01"), Decimal("1.50"), Decimal("9.99"),
                                        Decimal("12.34")]  # numeric(12,2) rounds half away from zero
        assert rows[1][2:] == (Decimal("0.1000000000"), datetime.date(2024, 2, 29),
                               datetime.datetime(2024, 2, 29, 10, 0, 0, 500000), datetime.timedelta(days=1, hours=2))
        assert rows[0][3] == datetime.datetime.now(datetime.timezone.utc).date()  # DEFAULT current_date
        assert conn.execute(f"SELECT * FROM {name} WHERE id = %s", (known,)).fetchall() == [values]
        assert conn.execute(f"SELECT sum(amount), sum(raw), min(at), max(span) FROM {name}").fetchall() == [
            (Decimal("17.34"), Decimal("3.3000000000"), datetime.datetime(2023, 1, 1), datetime.timedelta(days=1, hours=2))]
        conn.execute(f"UPDATE {name} SET amount = amount * 2, day = day + 1 WHERE id = %s", (known,))
        assert conn.execute(f"SELECT amount, day FROM {name} WHERE id = %s", (known,)).fetchall() == [
            (Decimal("24.68"), datetime.date(2024, 3, 2))]
        returned = conn.execute(f"INSERT INTO {name} (amount) VALUES (2) RETURNING id, amount, day").fetchone()
        assert returned is not None and isinstance(returned[0], uuid.UUID) and returned[1] == Decimal("2.00")

        conn.execute(f"CREATE INDEX {name}_day ON {name} (day)")
        assert conn.execute(f"SELECT amount FROM {name} WHERE day = %s", (datetime.date(2022, 12, 31),)).fetchall() \
            == [(Decimal("1.50"),)]


@pytest.mark.parametrize("statement, sqlstate", [
    ("INSERT INTO {t} (amount) VALUES (12345678901.5)", "22003"),  # numeric(12,2) overflow
    ("INSERT INTO {t} (raw) VALUES (0.00000000001)", "22003"),  # bare numeric holds 10 fractional digits: no rounding
    ("INSERT INTO {t} (raw) VALUES ('NaN')", "22003"),
    ("INSERT INTO {t} (amount) VALUES (NULL)", "23502"),
    ("INSERT INTO {t} (day) VALUES ('2024-02-30')", "22"),
    ("INSERT INTO {t} (id) VALUES ('not-a-uuid')", "22P02"),
])
def test_values_that_do_not_fit_are_refused(server: HeadraceProcess, statement: str, sqlstate: str) -> None:
    name = fresh("refused")
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        create(conn, name)
        with pytest.raises(psycopg.Error) as error:
            conn.execute(statement.format(t=name))
        assert error.value.sqlstate is not None and error.value.sqlstate.startswith(sqlstate)
        conn.execute(f"DROP TABLE {name}")


def test_exact_types_with_asyncpg_binary(server: HeadraceProcess) -> None:
    name = fresh("typed_pg")
    first, second = uuid.uuid4(), uuid.uuid4()

    async def body() -> None:
        conn = await asyncpg.connect(host="127.0.0.1", port=server.pg_port, user="headrace", database="headrace")
        try:
            await conn.execute(f"CREATE TABLE {name} (id uuid PRIMARY KEY, amount numeric(12,2), day date, "
                               "at timestamp, span interval)")
            await conn.executemany(f"INSERT INTO {name} VALUES ($1, $2, $3, $4, $5)", [
                (first, Decimal("1.25"), datetime.date(2024, 1, 1), datetime.datetime(2024, 1, 1, 12),
                 datetime.timedelta(hours=1)),
                (second, Decimal("2.50"), datetime.date(2024, 1, 2), datetime.datetime(2024, 1, 2, 12),
                 datetime.timedelta(days=1))])
            async with conn.transaction():
                await conn.execute(f"UPDATE {name} SET amount = $1 WHERE id = $2", Decimal("99.99"), first)
                await conn.execute(f"DELETE FROM {name} WHERE day = $1", datetime.date(2024, 1, 2))
            rows = await conn.fetch(f"SELECT * FROM {name}")
            assert [tuple(r) for r in rows] == [(first, Decimal("99.99"), datetime.date(2024, 1, 1),
                                                 datetime.datetime(2024, 1, 1, 12), datetime.timedelta(hours=1))]
            await conn.execute(f"CREATE INDEX {name}_id ON {name} (id)")
            assert await conn.fetchval(f"SELECT amount FROM {name} WHERE id = $1::uuid", first) == Decimal("99.99")
        finally:
            await conn.close()

    asyncio.run(body())


def test_defaults_and_on_conflict(server: HeadraceProcess) -> None:
    name = fresh("upsert")
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL DEFAULT 0, label text DEFAULT 'none', "
                     "at timestamptz DEFAULT now())")
        conn.execute(f"INSERT INTO {name} (id) VALUES (1), (2)")
        assert conn.execute(f"INSERT INTO {name} VALUES (1, 10), (3, 3) ON CONFLICT DO NOTHING RETURNING id, n") \
            .fetchall() == [(3, 3)]
        assert conn.execute(f"INSERT INTO {name} AS u (id, n, label) VALUES (1, 5, 'x'), (4, 4, DEFAULT) "
                            "ON CONFLICT (id) DO UPDATE SET n = u.n + EXCLUDED.n, label = EXCLUDED.label "
                            "RETURNING id, n, label").fetchall() == [(1, 5, "x"), (4, 4, "none")]
        assert conn.execute(f"INSERT INTO {name} (id, n) VALUES (2, 7) ON CONFLICT (id) DO UPDATE SET n = EXCLUDED.n "
                            f"WHERE {name}.n > 100").statusmessage == "INSERT 0 0"
        conn.cursor().executemany(f"INSERT INTO {name} (id, label) VALUES (%s, %s) "
                                  "ON CONFLICT (id) DO UPDATE SET label = EXCLUDED.label", [(2, "two"), (5, "five")])
        with pytest.raises(psycopg.errors.CardinalityViolation):
            conn.execute(f"INSERT INTO {name} (id) VALUES (1), (1) ON CONFLICT (id) DO UPDATE SET n = 0")
        with pytest.raises(psycopg.errors.InvalidColumnReference):
            conn.execute(f"INSERT INTO {name} (id) VALUES (1) ON CONFLICT (label) DO NOTHING")
        rows = conn.execute(f"SELECT id, n, label, at IS NOT NULL FROM {name} ORDER BY id").fetchall()
        assert rows == [(1, 5, "x", True), (2, 0, "two", True), (3, 3, "none", True), (4, 4, "none", True),
                        (5, 0, "five", True)]


def test_views_over_a_table_with_exact_types(server: HeadraceProcess) -> None:
    name = fresh("ledger")
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), amount numeric(12,2), "
                     "day date, at timestamp, span interval)")
        conn.execute(f"INSERT INTO {name} (amount, day, at, span) VALUES "
                     "(1.10, '2024-01-01', '2024-01-01 10:00', '1 hour'), "
                     "(2.20, '2024-01-01', '2024-01-01 11:00', '2 hours'), "
                     "(0.30, '2024-01-02', '2024-01-02 09:00', '1 day')")
        conn.execute(f"CREATE MATERIALIZED VIEW {name}_by_day AS SELECT day, count(*) AS n, min(at) AS first_at, "
                     f"max(at) AS last_at, max(span) AS longest FROM {name} GROUP BY day")
        conn.execute(f"CREATE MATERIALIZED VIEW {name}_ids AS SELECT id, day FROM {name}")
        conn.execute(f"INSERT INTO {name} (amount, day, at, span) VALUES (5.55, '2024-01-02', '2024-01-02 23:00', "
                     "'3 days')")
        conn.execute(f"DELETE FROM {name} WHERE amount = 2.20")
        rows = select_after_cold_start(conn, f"SELECT * FROM {name}_by_day ORDER BY day")
        cursor = conn.execute(f"SELECT * FROM {name}_by_day LIMIT 0")
        assert [d.type_code for d in cursor.description] == [1082, 20, 1114, 1114, 1186]
        assert rows == [
            (datetime.date(2024, 1, 1), 1, datetime.datetime(2024, 1, 1, 10), datetime.datetime(2024, 1, 1, 10),
             datetime.timedelta(hours=1)),
            (datetime.date(2024, 1, 2), 2, datetime.datetime(2024, 1, 2, 9), datetime.datetime(2024, 1, 2, 23),
             datetime.timedelta(days=3))]
        ids = conn.execute(f"SELECT id FROM {name}_ids").fetchall()
        assert sorted(ids) == sorted(conn.execute(f"SELECT id FROM {name}").fetchall()) and len(ids) == 3
        assert all(isinstance(i, uuid.UUID) for (i,) in ids)
