"""Column DEFAULTs of tables: a constant, now() / current_timestamp / current_date / localtimestamp, or
gen_random_uuid(), evaluated in Python per inserted row (no store round trip).

The default is kept as its SQL text in the catalog column (catalog/tables.TableColumn.default) and checked at
CREATE TABLE: an expression outside that set is refused with 0A000, a constant that does not fit the column
with its conversion error (22P02, 22003, ...), as PostgreSQL checks it. now() is the statement's time (per
statement, not per transaction as in PostgreSQL)."""

from __future__ import annotations

import datetime
import functools
import uuid
from typing import Any

import sqlglot
from sqlglot import exp

from headrace.catalog.tables import TableColumn
from headrace.errors import FeatureNotSupported, HeadraceError
from headrace.store.table_log import ValueError_, to_document

_NOW_FUNCTIONS = frozenset({"now", "transaction_timestamp", "statement_timestamp", "clock_timestamp"})


def default_ast(column: TableColumn) -> exp.Expr | None:
    if column.default is None:
        return None
    return _parsed(column.default).copy()


@functools.lru_cache(maxsize=1024)
def _parsed(sql: str) -> exp.Expr:
    return sqlglot.parse_one(sql, dialect="postgres")


def check_default(column: TableColumn) -> None:
    """Refuse (at CREATE TABLE) a default this module cannot evaluate or that does not fit the column."""
    default_document(column, datetime.datetime.now(datetime.timezone.utc))


def default_document(column: TableColumn, now: datetime.datetime) -> Any:
    """The column's default as a document value (None without a default)."""
    if column.default is None:
        return None
    value = _evaluate(_parsed(column.default), now, column)
    try:
        return to_document(column.pg_type, value, column.max_length, column.precision, column.scale)
    except ValueError_ as error:
        raise HeadraceError(error.message, sqlstate=error.sqlstate, detail=error.detail) from None


def _evaluate(node: exp.Expr, now: datetime.datetime, column: TableColumn) -> Any:
    if isinstance(node, exp.Paren):
        return _evaluate(node.this, now, column)
    if isinstance(node, exp.Cast):
        return _evaluate(node.this, now, column)
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Literal):
        return node.this if node.is_string else _number(node.this)
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        return -_number(node.this.this)
    if isinstance(node, exp.CurrentTimestamp) or (
            isinstance(node, exp.Anonymous) and node.name.lower() in _NOW_FUNCTIONS and not node.expressions):
        return now
    if isinstance(node, exp.CurrentDate):
        return now.date()
    if type(node).__name__ == "Localtimestamp" or isinstance(node, exp.Column) and node.name.lower() == "localtimestamp":
        return now.replace(tzinfo=None)
    if isinstance(node, exp.Uuid) or (isinstance(node, exp.Anonymous) and node.name.lower() == "gen_random_uuid"):
        return str(uuid.uuid4())
    raise FeatureNotSupported(f'DEFAULT {node.sql(dialect="postgres")} of column "{column.name}" is not supported',
                              hint="a DEFAULT is a constant, now(), current_timestamp, current_date or "
                                   "gen_random_uuid()")


def _number(text: str) -> Any:
    from decimal import Decimal

    try:
        return int(text)
    except ValueError:
        return Decimal(text)
