"""Writing what the coordinator returns (rows, command tags, empty queries) as backend messages;
shared by the simple and the extended query protocol."""

from __future__ import annotations

from collections.abc import Sequence

from headrace.coordinator.responses import (
    Column,
    CommandComplete,
    EmptyQuery,
    ExecuteResponse,
    SendingRows,
    Subscribing,
)
from headrace.errors import FeatureNotSupported, HeadraceError, ProtocolViolation
from headrace.pgwire import messages
from headrace.pgwire.types import BINARY_FORMAT, TEXT_FORMAT, type_size, value_encoder


def resolve_formats(codes: Sequence[int], column_count: int) -> tuple[int, ...]:
    """Bind's result format codes expanded to one per column: none = all text, one = for all."""
    if not codes:
        return (TEXT_FORMAT,) * column_count
    for code in codes:
        if code not in (TEXT_FORMAT, BINARY_FORMAT):
            raise HeadraceError(f"unsupported format code: {code}", sqlstate="22023")
    if len(codes) == 1:
        return (codes[0],) * column_count
    if len(codes) != column_count:
        raise ProtocolViolation(f"bind message has {len(codes)} result formats but query has "
                                f"{column_count} columns")
    return tuple(codes)


def row_description(columns: Sequence[Column], formats: Sequence[int]) -> bytes:
    return messages.row_description([
        (column.name, column.type_oid,
         column.type_size if column.type_size != -1 else type_size(column.type_oid),
         column.type_modifier, format_code)
        for column, format_code in zip(columns, formats, strict=True)
    ])


def append_result(out: bytearray, result: ExecuteResponse, formats: Sequence[int], *,
                  with_row_description: bool) -> None:
    """Rows (+ PortalSuspended or CommandComplete), a command tag with its notices, or
    EmptyQueryResponse. The simple protocol describes rows itself; the extended one left that to
    Describe, so there `with_row_description` is False."""
    if isinstance(result, SendingRows):
        if with_row_description:
            out += row_description(result.columns, formats)
        encoders = [value_encoder(column.type_oid, format_code)
                    for column, format_code in zip(result.columns, formats, strict=True)]
        messages.append_data_rows(out, result.rows, encoders)
        if result.suspended:
            out += messages.portal_suspended()
        else:
            out += messages.command_complete(f"{result.tag_verb} {len(result.rows)}")
    elif isinstance(result, CommandComplete):
        for notice in result.notices:
            out += messages.notice_response("NOTICE", "00000", notice)
        out += messages.command_complete(result.tag)
    elif isinstance(result, EmptyQuery):
        out += messages.empty_query_response()
    elif isinstance(result, Subscribing):
        # Streaming a bare SUBSCRIBE needs the transport to interleave waiting and writing; until it
        # does, say which two forms work rather than fail with an internal error.
        result.cancel()
        raise FeatureNotSupported("SUBSCRIBE as a bare statement is not supported over pgwire yet",
                                  hint="use DECLARE c CURSOR FOR SUBSCRIBE ...; FETCH ALL c, "
                                       "or COPY (SUBSCRIBE ...) TO STDOUT")
    else:
        raise TypeError(f"unexpected execute response {result!r}")
