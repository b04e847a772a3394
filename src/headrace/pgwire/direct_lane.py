"""Answering a whole point query at once: [Parse] Bind [Describe portal] Execute Sync, as drivers send it in
one packet, or a simple Query of one SELECT, handled as a unit when the coordinator can answer without waiting (an index lookup,
coordinator/fast_path.py, with no table write to wait for).

This is the protocol's per-query hot path (pgbench -M prepared / extended, psycopg, asyncpg): one call
instead of five message steps, no portal object, no coroutine. The responses are byte for byte those of
the message-by-message path. Anything else (a statement to plan, an error to report, rows to suspend, a
failed transaction block, a named portal) returns False with nothing consumed or written, and the general
path handles the same bytes."""

from __future__ import annotations

from headrace.pgwire import messages
from headrace.pgwire.interfaces import SessionClient
from headrace.pgwire.messages.frontend import BoundGroup
from headrace.pgwire.results import column_encoders, resolve_formats, row_description
from headrace.pgwire.simple_query import UNNAMED, single_statement
from headrace.pgwire.types import decode_parameter

_PARSE_COMPLETE = messages.parse_complete()
_BIND_COMPLETE = messages.bind_complete()
_SELECT_TAGS = [messages.command_complete(f"SELECT {count}") for count in range(16)]


def answer_bound_group(session: SessionClient, group: BoundGroup, out: bytearray) -> bool:
    """Write the group's whole response (through ReadyForQuery) into `out` and return True, or return False
    having changed nothing."""
    parse_sql = group.parse_sql
    statement = session.cached_statement(group.statement, parse_sql, group.parse_param_types)
    if statement is None:
        return False
    description = statement.description
    columns = description.columns
    param_types = description.param_types
    params = group.params
    if columns is None or len(params) != len(param_types):
        return False
    format_codes = group.param_formats
    if len(format_codes) > 1 and len(format_codes) != len(param_types):
        return False
    try:
        param_formats = resolve_formats(format_codes, len(param_types))
        values = [decode_parameter(type_oid, format_code, data) for type_oid, format_code, data
                  in zip(param_types, param_formats, params, strict=True)]
        result_formats = resolve_formats(group.result_formats, len(columns))
    except Exception:
        return False  # the general path reports it exactly
    rows = session.answer_now(statement, values)
    if rows is None or 0 < group.max_rows < len(rows):
        return False
    if parse_sql is not None:
        session.install_statement(group.statement, statement)
        out += _PARSE_COMPLETE
    out += _BIND_COMPLETE
    if group.describe:
        out += row_description(columns, result_formats)
    messages.append_data_rows(out, rows, column_encoders(columns, result_formats))
    count = len(rows)
    out += _SELECT_TAGS[count] if count < len(_SELECT_TAGS) else messages.command_complete(f"SELECT {count}")
    session.on_sync()
    out += messages.ready_for_query(session.transaction_status)
    return True


def answer_simple_query(session: SessionClient, sql: str, out: bytearray) -> bool:
    """A Query holding one point SELECT the plan cache knows (any literals): RowDescription, DataRows,
    CommandComplete and ReadyForQuery written into `out`, True; else False with nothing changed."""
    text = single_statement(sql)
    if text is None:
        return False
    statement = session.cached_statement(UNNAMED, text, ())
    if statement is None:
        return False
    columns = statement.description.columns
    if columns is None or statement.description.param_types:
        return False
    rows = session.answer_now(statement, ())
    if rows is None:
        return False
    formats = resolve_formats((), len(columns))
    out += row_description(columns, formats)
    messages.append_data_rows(out, rows, column_encoders(columns, formats))
    count = len(rows)
    out += _SELECT_TAGS[count] if count < len(_SELECT_TAGS) else messages.command_complete(f"SELECT {count}")
    session.close_statement(UNNAMED)  # as after any simple Query (PostgreSQL drops the unnamed statement)
    session.on_sync()
    out += messages.ready_for_query(session.transaction_status)
    return True
