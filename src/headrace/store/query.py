"""Running planned SELECTs against the serving store and describing their output in PostgreSQL terms."""

from __future__ import annotations

import datetime
import re
import uuid
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Protocol

import duckdb

from headrace.coordinator.responses import Column
from headrace.errors import DataError, HeadraceError, UndefinedColumn, UndefinedObject
from headrace.pgwire import types as pg
from headrace.sql.limits import StackDepthExceeded
from headrace.sql.select import SelectPlan, parameter_types_from_probe
from headrace.sql.types import oid_of_duckdb_type
from headrace.store.jsonb import jsonb_text
from headrace.store.serving import ServingStore

# Settings current_setting() can read beyond the session's variables: fixed facts of the server.
STATIC_SETTINGS = {
    "max_identifier_length": "63", "block_size": "8192", "max_index_keys": "32", "lc_collate": "C.UTF-8",
    "lc_ctype": "C.UTF-8", "transaction_read_only": "off", "default_transaction_read_only": "off",
    "statement_timeout": "0", "lock_timeout": "0", "idle_in_transaction_session_timeout": "0",
    "max_connections": "100", "data_directory_mode": "0700", "bytea_output": "hex",
    "default_table_access_method": "heap",
}


_SAMPLE_VALUES: dict[int, Any] = {
    pg.BOOL: False, pg.INT2: 0, pg.INT4: 0, pg.INT8: 0, pg.FLOAT4: 0.0, pg.FLOAT8: 0.0, pg.NUMERIC: Decimal(0),
    pg.TEXT: "", pg.VARCHAR: "", pg.JSON: "null", pg.JSONB: "null", pg.BYTEA: b"", pg.DATE: datetime.date(2000, 1, 1),
    pg.TIMESTAMP: datetime.datetime(2000, 1, 1), pg.UUID: uuid.UUID(int=0), pg.INTERVAL: datetime.timedelta(0),
    pg.TIMESTAMPTZ: datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc), pg.OID: 0,
}


class SessionFacts(Protocol):
    """What execution needs to know of a session (coordinator.session.Session satisfies it)."""

    user: str
    database: str
    variables: dict[str, str]
    connection_id: int


def session_setting_names() -> frozenset[str]:
    from headrace.coordinator.session import default_variables

    return frozenset(default_variables("", "", "")) | frozenset(STATIC_SETTINGS)


def session_parameters(plan: SelectPlan, params: Sequence[Any], session: SessionFacts | None) -> list[Any]:
    """The client's parameters followed by the session values the plan reads (plan.session_inputs)."""
    if not plan.session_inputs:
        return list(params)
    return [*params, *(_session_value(name, session) for name in plan.session_inputs)]


def _session_value(name: str, session: SessionFacts | None) -> Any:
    if session is None:
        from headrace.coordinator.session import default_variables

        variables: Mapping[str, str] = default_variables("headrace", "headrace", "")
        user, database, pid = "headrace", "headrace", 0
    else:
        variables, user, database, pid = session.variables, session.user, session.database, session.connection_id
    if name == "user":
        return user
    if name == "database":
        return database
    if name == "pid":
        return pid
    if name in ("setting_names", "setting_values"):
        settings = {**STATIC_SETTINGS, **variables}
        return list(settings) if name == "setting_names" else list(settings.values())
    setting = name.removeprefix("setting:")
    return variables.get(setting, STATIC_SETTINGS.get(setting))


def describe_query(store: ServingStore, plan: SelectPlan) -> tuple[Column, ...]:
    """Output columns without running the query: DuckDB plans a relation lazily."""
    with store.cursor() as cursor:
        try:
            # Typed sample values, not NULLs: DuckDB folds CAST(NULL AS DECIMAL) + 1 to an INTEGER.
            samples = [_SAMPLE_VALUES.get(oid) for oid in plan.param_types]
            samples += [[] if name.startswith("setting_") else None for name in plan.session_inputs]
            try:
                relation = cursor.sql(plan.duckdb_sql, params=samples or None)
            except duckdb.ConversionException:  # a sample the statement casts further ('' -> int)
                relation = cursor.sql(plan.duckdb_sql, params=[None] * len(samples) or None)
        except duckdb.Error as exc:
            raise translate_error(exc) from None
        return _columns(plan, relation.columns, [str(t) for t in relation.types])


def probe_parameter_types(store: ServingStore, plan: SelectPlan, declared: Sequence[int]) -> tuple[int, ...] | None:
    """The plan's parameter types with those compared to a typed expression inferred from it (its param_probe,
    described without running); None if DuckDB cannot describe the probe (the text default stays)."""
    assert plan.param_probe is not None
    with store.cursor() as cursor:
        try:
            types = [str(t) for t in cursor.sql(plan.param_probe[1]).types]
        except duckdb.Error:
            return None
    return parameter_types_from_probe(plan, declared, types, oid_of_duckdb_type)


def run_query(cursor: duckdb.DuckDBPyConnection, plan: SelectPlan, params: Sequence[Any],
              session: SessionFacts | None = None) -> tuple[tuple[Column, ...], list[tuple[Any, ...]]]:
    """Run a plan. `params` are the client's; session values the plan reads are appended here unless
    the caller already did (session_parameters)."""
    columns, result = _start(cursor, plan, params, session)
    return columns, fetch_rows(result, columns, None)


def run_query_chunk(cursor: duckdb.DuckDBPyConnection, plan: SelectPlan, params: Sequence[Any], chunk: int | None,
                    session: SessionFacts | None = None
                    ) -> tuple[tuple[Column, ...], list[tuple[Any, ...]], duckdb.DuckDBPyConnection | None]:
    """Run a plan and fetch its first `chunk` rows (None: all); the result to go on fetching from (`fetch_rows`)
    when there may be more, else None. DuckDB produces the rest only as they are fetched: memory stays bounded."""
    columns, result = _start(cursor, plan, params, session)
    rows = fetch_rows(result, columns, chunk)
    return columns, rows, (result if chunk is not None and len(rows) == chunk else None)


def fetch_rows(result: duckdb.DuckDBPyConnection, columns: Sequence[Column], chunk: int | None) -> list[tuple[Any, ...]]:
    """The next `chunk` rows of a running query (None: all of them); an error met producing them as PostgreSQL's."""
    try:
        rows = result.fetchall() if chunk is None else result.fetchmany(chunk)
    except duckdb.Error as exc:
        raise translate_error(exc) from None
    return _postgres_values(columns, rows)


def _start(cursor: duckdb.DuckDBPyConnection, plan: SelectPlan, params: Sequence[Any],
           session: SessionFacts | None) -> tuple[tuple[Column, ...], duckdb.DuckDBPyConnection]:
    if plan.session_inputs and len(params) == len(plan.param_types):
        params = session_parameters(plan, params, session)
    try:
        result = cursor.execute(plan.duckdb_sql, list(params) or None)
    except duckdb.Error as exc:
        raise translate_error(exc) from None
    description = result.description or []
    names = [entry[0] for entry in description]
    types = [str(entry[1]) for entry in description]
    return _columns(plan, names, types), result


def _postgres_values(columns: Sequence[Column], rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Values whose PostgreSQL text differs from what the store returns: jsonb is normalized
    (key order, spacing) as PostgreSQL's jsonb prints it."""
    jsonb_positions = [i for i, column in enumerate(columns) if column.type_oid == pg.JSONB]
    if not jsonb_positions or not rows:
        return rows
    converted = []
    for row in rows:
        values = list(row)
        for i in jsonb_positions:
            if isinstance(values[i], str):
                values[i] = jsonb_text(values[i])
        converted.append(tuple(values))
    return converted


def _columns(plan: SelectPlan, names: Sequence[str], types: Sequence[str]) -> tuple[Column, ...]:
    # The plan aliased every projection with PostgreSQL's column name; a * expands in the store.
    return tuple(Column(name, oid_of_duckdb_type(type_name)) for name, type_name in zip(names, types))


_MISSING_FUNCTION = re.compile(r"(?:Scalar|Table|Aggregate|Pragma|Macro|Table Macro) Function with name (\S+) does not exist")


def translate_error(exc: duckdb.Error) -> HeadraceError:
    """DuckDB's errors in PostgreSQL's terms; the message loses DuckDB's class prefix."""
    message = str(exc).split("\n")[0]
    for prefix in ("Binder Error: ", "Catalog Error: ", "Conversion Error: ", "Invalid Input Error: ",
                   "Parser Error: ", "Out of Range Error: ", "Not implemented Error: "):
        message = message.removeprefix(prefix)
    if isinstance(exc, duckdb.PermissionException):
        # The store's lockdown (store/serving.locked_down_config) refused a file, extension or setting.
        return HeadraceError("permission denied: the serving store reads no files", sqlstate="42501")
    if isinstance(exc, duckdb.CatalogException):
        missing = _MISSING_FUNCTION.match(message)
        if missing is not None:  # a function neither PostgreSQL's nor translated: PostgreSQL's words for it
            return HeadraceError(f"function {missing.group(1)} does not exist", sqlstate="42883",
                                 hint="No function matches the given name and argument types. You might need to "
                                      "add explicit type casts.")
        return UndefinedObject(message)
    if isinstance(exc, duckdb.ParserException) and message.startswith("Max expression depth limit"):
        return StackDepthExceeded()
    if isinstance(exc, duckdb.BinderException):
        if "not found" in message and "olumn" in message:
            return UndefinedColumn(message)
        return HeadraceError(message, sqlstate="42883" if "function" in message.lower() else "42804")
    if message == "division by zero":
        return DataError(message, sqlstate="22012")
    if message.startswith(("relation \"", "type \"", "schema \"", "role \"", "function \"")) and message.endswith("does not exist"):
        return HeadraceError(message, sqlstate="42P01" if message.startswith("relation") else "42704")
    if isinstance(exc, (duckdb.ConversionException, duckdb.InvalidInputException, duckdb.OutOfRangeException)):
        return DataError(message, sqlstate="22P02" if isinstance(exc, duckdb.ConversionException) else "22003")
    if isinstance(exc, duckdb.ParserException):
        return HeadraceError(message, sqlstate="42601")
    if isinstance(exc, duckdb.InterruptException):
        return HeadraceError("canceling statement due to user request", sqlstate="57014")
    return HeadraceError(message, sqlstate="XX000")
