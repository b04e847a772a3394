"""Writing what the coordinator returns (rows, command tags, empty queries, SUBSCRIBE streams) as backend
messages; shared by the simple and the extended query protocol."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence

from headrace.coordinator.responses import (
    Column,
    CommandComplete,
    EmptyQuery,
    ExecuteResponse,
    SendingRows,
    Subscribing,
)
from headrace.coordinator.cursors import SubscriptionBuffer
from headrace.errors import HeadraceError, ProtocolViolation, as_notice
from headrace.pgwire import messages
from headrace.pgwire.types import BINARY_FORMAT, TEXT_FORMAT, cell_encoder, type_size, value_encoder


# Per-query work cached across statements and connections (keys are immutable: Column is frozen).
# Bounded: a client inventing new column lists forever only clears them now and then.
_CACHE_LIMIT = 4096
_ALL_TEXT = [(TEXT_FORMAT,) * count for count in range(64)]
_row_descriptions: dict[tuple[tuple[Column, ...], tuple[int, ...]], bytes] = {}
_encoders: dict[tuple[tuple[Column, ...], tuple[int, ...]], list[Callable[[object], bytes]]] = {}


def resolve_formats(codes: Sequence[int], column_count: int) -> tuple[int, ...]:
    """Bind's result format codes expanded to one per column: none = all text, one = for all."""
    if not codes:
        return _ALL_TEXT[column_count] if column_count < 64 else (TEXT_FORMAT,) * column_count
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
    key = (tuple(columns), tuple(formats))
    cached = _row_descriptions.get(key)
    if cached is None:
        if len(_row_descriptions) >= _CACHE_LIMIT:
            _row_descriptions.clear()
        cached = _row_descriptions[key] = _encode_row_description(columns, formats)
    return cached


def column_encoders(columns: Sequence[Column], formats: Sequence[int]) -> list[Callable[[object], bytes]]:
    """One value encoder per column (shared: callers must not change the list)."""
    key = (tuple(columns), tuple(formats))
    cached = _encoders.get(key)
    if cached is None:
        if len(_encoders) >= _CACHE_LIMIT:
            _encoders.clear()
        cached = _encoders[key] = [_encoder(column, format_code)
                                   for column, format_code in zip(columns, formats, strict=True)]
    return cached


def _encoder(column: Column, format_code: int) -> Callable[[object], bytes]:
    return cell_encoder(column.type_oid, column.raw_format, format_code)


def _encode_row_description(columns: Sequence[Column], formats: Sequence[int]) -> bytes:
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
        messages.append_data_rows(out, result.rows, column_encoders(result.columns, formats))
        if result.more:
            pass  # the rest follows: send_rows
        elif result.suspended:
            out += messages.portal_suspended()
        else:
            out += messages.command_complete(result.command_tag)
    elif isinstance(result, CommandComplete):
        for notice in map(as_notice, result.notices):
            out += messages.notice_response(notice.severity, notice.sqlstate, notice.message, detail=notice.detail,
                                            hint=notice.hint)
        for name, value in result.parameters:  # SET of a reported variable (TimeZone, ...): ParameterStatus
            out += messages.parameter_status(name, value)
        out += messages.command_complete(result.tag)
    elif isinstance(result, EmptyQuery):
        out += messages.empty_query_response()
    elif isinstance(result, Subscribing):
        result.cancel()
        raise TypeError("a SUBSCRIBE streams: stream_subscription writes it")
    else:
        raise TypeError(f"unexpected execute response {result!r}")


Flush = Callable[[], Awaitable[None]]
NextPiece = Callable[[], Awaitable[ExecuteResponse]]


async def send_rows(out: bytearray, result: ExecuteResponse, formats: Sequence[int], *, with_row_description: bool,
                    next_piece: NextPiece, flush: Flush | None) -> None:
    """`append_result`, and for a large result the pieces after the first (`SendingRows.more`): each written to
    the socket and drained before the next is asked for, so a slow client holds the rows back in the store."""
    append_result(out, result, formats, with_row_description=with_row_description)
    while isinstance(result, SendingRows) and result.more:
        if flush is not None:
            await flush()
        result = await next_piece()
        append_result(out, result, formats, with_row_description=False)
# Set by the transport: reads from the client while a statement streams, so that a client that goes away
# is noticed (it then cancels the running statement); returns at end of input.
WatchPeer = Callable[[], Awaitable[None]]


async def stream_subscription(out: bytearray, result: Subscribing, formats: Sequence[int], *,
                              with_row_description: bool, cancel: asyncio.Event, flush: Flush | None,
                              watch_peer: WatchPeer | None) -> None:
    """A bare SUBSCRIBE, as Materialize streams it: (RowDescription,) then DataRows as changes commit, each
    batch written at once, until the stream ends (UP TO: CommandComplete "SUBSCRIBE <n>") or is cancelled
    (CancelRequest, or the client going away: 57014 raised, the caller writes the ErrorResponse)."""
    if with_row_description:
        out += row_description(result.columns, formats)
    encoders = [value_encoder(column.type_oid, format_code)
                for column, format_code in zip(result.columns, formats, strict=True)]
    buffer = SubscriptionBuffer(result)
    watcher = asyncio.ensure_future(watch_peer()) if watch_peer is not None else None
    sent = 0
    try:
        if flush is not None:
            await flush()
        while True:
            rows = await buffer.take(None, None, cancel)  # >= 1 row, or [] once the stream ended
            if not rows and buffer.finished:
                break
            messages.append_data_rows(out, rows, encoders)
            sent += len(rows)
            if flush is not None:
                await flush()
    finally:
        buffer.close()
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await watcher
    out += messages.command_complete(f"SUBSCRIBE {sent}")
