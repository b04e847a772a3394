"""Timestamps and dates of any year PostgreSQL holds, and +-infinity, in the document form (store/table_types.py):
PostgreSQL's ISO text parsed to microseconds / days and printed back (the numbers are PostgreSQL 15's own
`extract(epoch from ...) * 1000000` and `date - date '1970-01-01'`); the driver's COPY staging of them."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest

from headrace.materialize.drivers.postgres_sql import Column, staged_from_arrow, staged_from_values
from headrace.store import table_types
from headrace.coordinator.temp_relations import shadowed_names
from headrace.sql.parser import parse_statement


@pytest.mark.parametrize("text, micros", [
    ("1970-01-01 00:00:00", 0),
    ("1997-02-10 17:32:01.000001", 855595921000001),
    ("0097-02-16 17:32:01 BC", -65192711279000000),
    ("10000-03-12 23:58:48", 253408521528000000),
    ("infinity", table_types.TIME_INFINITY),
    ("-infinity", table_types.TIME_MINUS_INFINITY),
])
def test_time_text_round_trips(text: str, micros: int) -> None:
    assert table_types.parse_time_text(text) == micros
    assert table_types.time_text(micros, with_zone=False) == text


def test_zones_and_dates() -> None:
    # timestamptz as PostgreSQL prints it in another TimeZone: the offset is applied (seconds too, as for LMT)
    assert table_types.parse_time_text("1997-02-10 09:32:01-08") == table_types.parse_time_text("1997-02-10 17:32:01")
    assert table_types.parse_time_text("1883-11-18 11:52:58-07:52:58") == \
        table_types.parse_time_text("1883-11-18 19:45:56")
    assert table_types.time_text(0, with_zone=True) == "1970-01-01 00:00:00+00"
    assert table_types.parse_time_text("0097-02-16 BC", days_only=True) == -754546
    assert table_types.date_text(-754546) == "0097-02-16 BC"
    assert table_types.date_text(table_types.DATE_INFINITY) == "infinity"
    for days in range(-800_000, 3_000_000, 7919):  # the calendar agrees with Python's where Python has one
        if -719_162 <= days <= 2_932_896:
            day = datetime.date(1970, 1, 1) + datetime.timedelta(days=days)
            assert table_types.civil_from_days(days) == (day.year, day.month, day.day)
        assert table_types.days_from_civil(*table_types.civil_from_days(days)) == days
    with pytest.raises(ValueError):
        table_types.parse_time_text("Feb 10 1997")


def test_documents_take_exact_values() -> None:
    assert table_types.to_document("timestamp", table_types.Exact(-5)) == -5
    assert table_types.to_document("date", table_types.Exact(table_types.DATE_INFINITY)) == table_types.DATE_INFINITY
    with pytest.raises(Exception) as refused:  # RETURNING cannot hand it to pgwire as a datetime yet
        table_types.to_python("timestamp", table_types.TIME_INFINITY)
    assert getattr(refused.value, "sqlstate", None) == "0A000"


def test_driver_stages_them_as_postgresql_input() -> None:
    column = Column("d", "TIMESTAMP", '"d"')
    staged = staged_from_values(column, [0, table_types.TIME_INFINITY, None, -65192711279000000])
    assert staged.to_pylist() == ["1970-01-01 00:00:00", "infinity", None, "0097-02-16 17:32:01 BC"]
    assert staged_from_values(column, [0, None]).type == pa.timestamp("us")  # the common case stays columnar
    dates = staged_from_arrow(Column("a", "DATE", '"a"'), pa.array([0, table_types.DATE_MINUS_INFINITY], pa.int64()))
    assert dates.to_pylist() == ["1970-01-01", "-infinity"]


def test_temporary_names_shadow_unqualified_ones_only() -> None:
    temporary = frozenset({"float8_tbl", "Mixed"})
    assert shadowed_names(parse_statement("SELECT * FROM FLOAT8_TBL f JOIN other USING (x)"), temporary) == \
        {"float8_tbl"}
    assert shadowed_names(parse_statement("SELECT * FROM public.float8_tbl"), temporary) == frozenset()
    assert shadowed_names(parse_statement("WITH float8_tbl AS (SELECT 1) SELECT * FROM float8_tbl"),
                          temporary) == frozenset()
    assert shadowed_names(parse_statement('SELECT * FROM "Mixed", mixed'), temporary) == {"Mixed"}


@pytest.mark.parametrize("text, rounded", [  # PostgreSQL 15's '<text>'::timestamp(2)
    ("1997-02-10 17:32:01.999999", "1997-02-10 17:32:02"), ("1997-02-10 17:32:01.005", "1997-02-10 17:32:01"),
    ("1960-02-10 17:32:01.015", "1960-02-10 17:32:01.01"), ("2001-01-01 00:00:00.005", "2001-01-01 00:00:00.01"),
    ("0097-02-16 17:32:01.555 BC", "0097-02-16 17:32:01.55 BC"), ("infinity", "infinity"),
])
def test_timestamp_precision_rounds_as_postgresql(text: str, rounded: str) -> None:
    assert table_types.time_text(table_types.round_time(table_types.parse_time_text(text), 2), False) == rounded
    assert table_types.to_document("timestamp", table_types.Exact(table_types.parse_time_text(text)), 2) == \
        table_types.parse_time_text(rounded)
