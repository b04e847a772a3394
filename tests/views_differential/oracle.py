"""Run the same statements on headrace and on PostgreSQL 15 and compare a view with its SELECT run on PostgreSQL.

Compared: the column names, their types (RowDescription OIDs) and every value's text as it comes off the wire, exact,
with two exceptions: floats to 12 significant digits, since PostgreSQL itself sums floats in scan order (the last bits
of a float sum depend on row order there too); and on the DuckDB serving store, numeric by value, since DuckDB's
DECIMAL has one scale per column where PostgreSQL's numeric keeps each value's own (docs/views.md "Types"). On the
PostgreSQL serving store numeric text is compared exactly."""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg

from tests.e2e.server_process import SERVING_ON_POSTGRES

CATCH_UP_S = 300.0
FLOAT_OIDS = (700, 701)
NUMERIC_OID = 1700
NUMERIC_BY_VALUE = not SERVING_ON_POSTGRES


def normalized(value: bytes | None, type_oid: int) -> Any:
    if value is None:
        return None
    text = value.decode()
    if type_oid in FLOAT_OIDS:
        number = float(text)
        if math.isnan(number) or math.isinf(number):
            return text
        return float(f"{number:.12g}") + 0.0  # + 0.0: -0.0 and 0.0 are one value
    if type_oid == NUMERIC_OID and NUMERIC_BY_VALUE:
        return Decimal(text).normalize() + 0
    return text


def multiset(rows: list[tuple[Any, ...]], types: list[int]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(normalized(v, t) for v, t in zip(row, types)) for row in rows)


@dataclass
class Outcome:
    rows: list[tuple[Any, ...]] | None  # each value's text (bytes) as sent, None for NULL
    error: tuple[str, str] | None  # (sqlstate, message)
    columns: list[tuple[str, int]] | None = None  # (name, type OID)


@dataclass
class Pair:
    headrace: psycopg.Connection[Any]
    oracle: psycopg.Connection[Any]

    @classmethod
    def connect(cls, headrace_dsn: str, oracle_url: str) -> Pair:
        oracle = psycopg.connect(oracle_url, autocommit=True)
        oracle.execute("SET TimeZone = 'UTC'")
        headrace = psycopg.connect(headrace_dsn, autocommit=True)
        headrace.execute("SET TimeZone = 'UTC'")
        return cls(headrace, oracle)

    def close(self) -> None:
        self.headrace.close()
        self.oracle.close()

    def both(self, sql: str) -> None:
        """A statement both must accept (the tables and the writes)."""
        self.headrace.execute(sql)
        self.oracle.execute(sql)

    def select(self, connection: psycopg.Connection[Any], sql: str) -> Outcome:
        try:
            cursor = connection.execute(sql)
            result = cursor.pgresult
            assert result is not None and cursor.description is not None
            rows = [tuple(result.get_value(r, c) for c in range(result.nfields)) for r in range(result.ntuples)]
            return Outcome(rows, None, [(d.name, d.type_code) for d in cursor.description])
        except psycopg.Error as error:
            return Outcome(None, (error.sqlstate or "", error.diag.message_primary or str(error)))

    def compare(self, view: str, select: str) -> str | None:
        """None if `view` on headrace equals `select` on PostgreSQL, else what differs."""
        mine = self.select(self.headrace, f'SELECT * FROM "{view}"')
        deadline = time.monotonic() + CATCH_UP_S
        while mine.error is not None and mine.error[0] == "57P03" and time.monotonic() < deadline:
            # the pipeline restarting the table's query after a CREATE (slow on a loaded 2-core machine)
            mine = self.select(self.headrace, f'SELECT * FROM "{view}"')
        truth = self.select(self.oracle, select)
        if truth.error is not None or mine.error is not None:
            if mine.error == truth.error:
                return None
            return f"{view}: headrace {mine.error or 'rows'} / PostgreSQL {truth.error or 'rows'}\n  {select}"
        assert mine.rows is not None and truth.rows is not None and mine.columns and truth.columns
        if mine.columns != truth.columns:
            return f"{view}: {select}\n  columns (name, type oid): view {mine.columns} / PostgreSQL {truth.columns}"
        types = [type_oid for _, type_oid in truth.columns]
        got, expected = multiset(mine.rows, types), multiset(truth.rows, types)
        if got == expected:
            return None
        return (f"{view}: {select}\n  only in the view: {sorted((got - expected).elements(), key=repr)[:5]}\n"
                f"  only in PostgreSQL: {sorted((expected - got).elements(), key=repr)[:5]}")
