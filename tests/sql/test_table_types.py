"""Tables' exact column types (numeric, date, timestamp, uuid, interval) and DEFAULTs: the statement compiler
(CREATE TABLE -> catalog Table) and the document form (store/table_types.py), without a server."""

from __future__ import annotations

import datetime
import uuid
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.coordinator.table_defaults import default_document
from headrace.errors import HeadraceError
from headrace.sql.table_statements import table_from_create_sql
from headrace.store import table_types
from headrace.store.table_log import ValueError_, from_store, to_document

NOW = datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.timezone.utc)


def test_exact_types_map_to_native_duckdb_types_and_postgres_oids() -> None:
    table = table_from_create_sql("u1", "CREATE TABLE t (id uuid PRIMARY KEY, a numeric(12,2), b numeric, c decimal(5), "
                                        "d date, e timestamp, f timestamp without time zone, g interval)")
    shapes = {c.name: (c.store_type, c.type_oid, c.type_sql) for c in table.columns}
    assert shapes == {
        "id": ("UUID", 2950, "uuid"), "a": ("DECIMAL(12,2)", 1700, "numeric(12,2)"),
        "b": ("DECIMAL(38,10)", 1700, "numeric"), "c": ("DECIMAL(5,0)", 1700, "numeric(5,0)"),
        "d": ("DATE", 1082, "date"), "e": ("TIMESTAMP", 1114, "timestamp"), "f": ("TIMESTAMP", 1114, "timestamp"),
        "g": ("INTERVAL", 1186, "interval")}


@pytest.mark.parametrize("sql, sqlstate", [
    ("CREATE TABLE t (a numeric(39))", "0A000"),  # wider than DuckDB's DECIMAL holds exactly
    ("CREATE TABLE t (a numeric(5,6))", "0A000"),
    ("CREATE TABLE t (a int DEFAULT 'x')", "22P02"),  # a default that does not fit the column
    ("CREATE TABLE t (a numeric(3,1) DEFAULT 100)", "22003"),
    ("CREATE TABLE t (a int DEFAULT a + 1)", "0A000"),
    ("CREATE TABLE t (a timestamptz DEFAULT now() + interval '1 day')", "0A000"),
])
def test_refused_types_and_defaults(sql: str, sqlstate: str) -> None:
    with pytest.raises(HeadraceError) as error:
        table_from_create_sql("u1", sql)
    assert error.value.sqlstate == sqlstate


def test_defaults_are_evaluated_per_row() -> None:
    table = table_from_create_sql("u1", "CREATE TABLE t (id uuid DEFAULT gen_random_uuid(), n int DEFAULT -3, "
                                        "s text DEFAULT 'x', at timestamptz DEFAULT now(), d date DEFAULT current_date, "
                                        "l timestamp DEFAULT localtimestamp, m numeric(6,2) DEFAULT 1.5, z int)")
    values = {c.name: default_document(c, NOW) for c in table.columns}
    assert uuid.UUID(values["id"]).version == 4
    assert values["id"] != default_document(table.columns[0], NOW)
    assert values["n"] == -3 and values["s"] == "x" and values["m"] == "1.50" and values["z"] is None
    assert values["at"] == table_types._timestamp_micros(NOW)
    assert values["d"] == (NOW.date() - datetime.date(1970, 1, 1)).days
    assert values["l"] == values["at"]  # sessions run in UTC


@pytest.mark.parametrize("pg_type, text, python", [
    ("date", "2024-02-29", datetime.date(2024, 2, 29)),
    ("timestamp", "2024-02-29 10:11:12.5", datetime.datetime(2024, 2, 29, 10, 11, 12, 500000)),
    ("interval", "1 day 02:00", datetime.timedelta(days=1, hours=2)),
    ("uuid", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
    ("numeric", " 12.5 ", Decimal("12.5")),
])
def test_text_input_and_python_values_agree(pg_type: str, text: str, python: object) -> None:
    document = to_document(pg_type, text)
    assert document == to_document(pg_type, python)
    assert table_types.to_python(pg_type, document) == python


@pytest.mark.parametrize("pg_type, value, precision, scale, sqlstate", [
    ("numeric", "1.00000000001", None, None, "22003"),  # more than 10 fractional digits: refused, not rounded
    ("numeric", "NaN", None, None, "22003"),
    ("numeric", "Infinity", 10, 2, "22003"),
    ("numeric", "123456789.1", 10, 2, "22003"),
    ("numeric", "1e40", None, None, "22003"),
    ("numeric", "abc", None, None, "22P02"),
    ("date", "2024-13-01", None, None, "22P02"),
    ("uuid", "not-a-uuid", None, None, "22P02"),
    ("interval", "forever", None, None, "22P02"),
])
def test_values_that_do_not_fit_are_refused(pg_type: str, value: str, precision: int | None, scale: int | None,
                                            sqlstate: str) -> None:
    with pytest.raises(ValueError_) as error:
        to_document(pg_type, value, None, precision, scale)
    assert error.value.sqlstate.startswith(sqlstate[:2]) and error.value.sqlstate == sqlstate


def test_declared_scale_rounds_half_away_from_zero_as_postgres() -> None:
    assert to_document("numeric", "1.005", None, 10, 2) == "1.01"
    assert to_document("numeric", "-1.005", None, 10, 2) == "-1.01"
    assert to_document("numeric", 7, None, 5, 0) == "7"


@given(st.decimals(min_value=Decimal("-1e27"), max_value=Decimal("1e27"), allow_nan=False, allow_infinity=False,
                   places=10))
def test_unconstrained_numeric_keeps_every_value_it_accepts_exactly(number: Decimal) -> None:
    document = to_document("numeric", number)
    assert Decimal(document) == number
    assert from_store("DECIMAL(38,10)", Decimal(document)) == document


@given(st.decimals(allow_nan=False, allow_infinity=False))
def test_unconstrained_numeric_never_rounds_silently(number: Decimal) -> None:
    try:
        document = to_document("numeric", number)
    except ValueError_ as error:
        assert error.sqlstate == "22003"
    else:
        assert Decimal(document) == number


@given(st.datetimes(min_value=datetime.datetime(1, 1, 2), max_value=datetime.datetime(9999, 12, 30)))
def test_timestamps_and_dates_round_trip(value: datetime.datetime) -> None:
    assert table_types.to_python("timestamp", to_document("timestamp", value)) == value
    assert table_types.to_python("date", to_document("date", value.date())) == value.date()
    assert from_store("TIMESTAMP", value) == to_document("timestamp", value)


@given(st.timedeltas(min_value=datetime.timedelta(days=-10**6), max_value=datetime.timedelta(days=10**6)))
def test_intervals_round_trip(value: datetime.timedelta) -> None:
    assert table_types.to_python("interval", to_document("interval", value)) == value
