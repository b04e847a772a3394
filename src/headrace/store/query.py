"""Running planned SELECTs against the serving store and describing their output in PostgreSQL terms."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import duckdb

from headrace.coordinator.responses import Column
from headrace.errors import DataError, HeadraceError, UndefinedColumn, UndefinedObject
from headrace.sql.select import SelectPlan
from headrace.sql.types import oid_of_duckdb_type
from headrace.store.serving import ServingStore


def describe_query(store: ServingStore, plan: SelectPlan) -> tuple[Column, ...]:
    """Output columns without running the query: DuckDB plans a relation lazily."""
    with store.cursor() as cursor:
        try:
            relation = cursor.sql(plan.duckdb_sql, params=[None] * len(plan.param_types) or None)
        except duckdb.Error as exc:
            raise translate_error(exc) from None
        return _columns(plan, relation.columns, [str(t) for t in relation.types])


def run_query(cursor: duckdb.DuckDBPyConnection, plan: SelectPlan, params: Sequence[Any]) -> tuple[tuple[Column, ...], list[tuple[Any, ...]]]:
    try:
        result = cursor.execute(plan.duckdb_sql, list(params) or None)
        rows = result.fetchall()
    except duckdb.Error as exc:
        raise translate_error(exc) from None
    description = result.description or []
    names = [entry[0] for entry in description]
    types = [str(entry[1]) for entry in description]
    return _columns(plan, names, types), rows


def _columns(plan: SelectPlan, names: Sequence[str], types: Sequence[str]) -> tuple[Column, ...]:
    # The plan aliased every projection with PostgreSQL's column name; a * expands in the store.
    return tuple(Column(name, oid_of_duckdb_type(type_name)) for name, type_name in zip(names, types))


def translate_error(exc: duckdb.Error) -> HeadraceError:
    """DuckDB's errors in PostgreSQL's terms; the message loses DuckDB's class prefix."""
    message = str(exc).split("\n")[0]
    for prefix in ("Binder Error: ", "Catalog Error: ", "Conversion Error: ", "Invalid Input Error: ",
                   "Parser Error: ", "Out of Range Error: ", "Not implemented Error: "):
        message = message.removeprefix(prefix)
    if isinstance(exc, duckdb.CatalogException):
        return UndefinedObject(message)
    if isinstance(exc, duckdb.BinderException):
        if "not found" in message and "olumn" in message:
            return UndefinedColumn(message)
        return HeadraceError(message, sqlstate="42883" if "function" in message.lower() else "42804")
    if isinstance(exc, (duckdb.ConversionException, duckdb.InvalidInputException, duckdb.OutOfRangeException)):
        return DataError(message, sqlstate="22P02" if isinstance(exc, duckdb.ConversionException) else "22003")
    if isinstance(exc, duckdb.ParserException):
        return HeadraceError(message, sqlstate="42601")
    if isinstance(exc, duckdb.InterruptException):
        return HeadraceError("canceling statement due to user request", sqlstate="57014")
    return HeadraceError(message, sqlstate="XX000")
