"""Run the same statements on headrace and on PostgreSQL 15 and compare a view with its SELECT run on PostgreSQL.

Compared: the column names, their types (RowDescription OIDs) and every value's text as it comes off the wire, exact,
with three exceptions: floats to 12 significant digits, since PostgreSQL itself sums floats in scan order (the last
bits of a float sum depend on row order there too); an array as the multiset of its elements' text, since
PostgreSQL's array_agg without ORDER BY keeps whatever order its plan reads the rows in (a hash or a sort, heap order
after updates), of which headrace's arrival order is one; and on the DuckDB serving store, numeric by value, since
DuckDB's DECIMAL has one scale per column where PostgreSQL's numeric keeps each value's own (docs/views.md "Types").
On the PostgreSQL serving store numeric text is compared exactly."""

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
# bool[], int2[], int4[], text[], int8[], float4[], float8[], date[], numeric[], timestamptz[], jsonb[]
ARRAY_OIDS = {1000: 16, 1005: 21, 1007: 23, 1009: 25, 1016: 20, 1021: 700, 1022: 701, 1182: 1082, 1231: 1700,
              1185: 1184, 3807: 3802}


def array_elements(text: str) -> list[str | None]:
    """A one-dimensional array's text (`{1,NULL,"a b","x\\"y"}`) as its elements' text, NULL as None."""
    assert text.startswith("{") and text.endswith("}"), text
    elements: list[str | None] = []
    position, body = 0, text[1:-1]
    while position < len(body):
        if body[position] == '"':
            value, position = [], position + 1
            while body[position] != '"':
                if body[position] == "\\":
                    position += 1
                value.append(body[position])
                position += 1
            elements.append("".join(value))
            position += 2  # the closing quote and the comma
        else:
            end = body.find(",", position)
            end = len(body) if end < 0 else end
            element = body[position:end]
            elements.append(None if element == "NULL" else element)
            position = end + 1
    return elements


def normalized(value: bytes | None, type_oid: int) -> Any:
    if value is None:
        return None
    text = value.decode()
    if type_oid in ARRAY_OIDS:
        element_oid = ARRAY_OIDS[type_oid]
        elements = [normalized(None if e is None else e.encode(), element_oid) for e in array_elements(text)]
        return ("array", tuple(sorted(elements, key=lambda e: (e is None, repr(e)))))
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
