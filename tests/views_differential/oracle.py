"""Run the same statements on headrace and on PostgreSQL 15 and compare a view with its SELECT run on PostgreSQL.

Values are compared as PostgreSQL's: numeric values as the float8 the view holds (views store numeric as float8,
docs/views.md "Types"); floats to 12 significant digits, since PostgreSQL itself sums floats in scan order, so
the last bits of a float sum depend on row order there too."""

from __future__ import annotations

import datetime
import math
import time
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg

CATCH_UP_S = 300.0


def normalized(value: Any) -> Any:
    if isinstance(value, Decimal):
        value = float(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return repr(value)
        return float(f"{value:.12g}") + 0.0  # + 0.0: -0.0 and 0.0 are one value
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return value.astimezone(datetime.timezone.utc)
    if isinstance(value, list):
        return tuple(normalized(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, normalized(v)) for k, v in value.items()))
    return value


def multiset(rows: list[tuple[Any, ...]]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(normalized(v) for v in row) for row in rows)


@dataclass
class Outcome:
    rows: list[tuple[Any, ...]] | None
    error: tuple[str, str] | None  # (sqlstate, message)


@dataclass
class Pair:
    headrace: psycopg.Connection[Any]
    oracle: psycopg.Connection[Any]

    @classmethod
    def connect(cls, headrace_dsn: str, oracle_url: str) -> Pair:
        oracle = psycopg.connect(oracle_url, autocommit=True)
        oracle.execute("SET TimeZone = 'UTC'")
        return cls(psycopg.connect(headrace_dsn, autocommit=True), oracle)

    def close(self) -> None:
        self.headrace.close()
        self.oracle.close()

    def both(self, sql: str) -> None:
        """A statement both must accept (the tables and the writes)."""
        self.headrace.execute(sql)
        self.oracle.execute(sql)

    def select(self, connection: psycopg.Connection[Any], sql: str) -> Outcome:
        try:
            return Outcome(connection.execute(sql).fetchall(), None)
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
        assert mine.rows is not None and truth.rows is not None
        got, expected = multiset(mine.rows), multiset(truth.rows)
        if got == expected:
            return None
        return (f"{view}: {select}\n  only in the view: {sorted((got - expected).elements(), key=repr)[:5]}\n"
                f"  only in PostgreSQL: {sorted((expected - got).elements(), key=repr)[:5]}")
