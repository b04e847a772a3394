"""The COPY sub-protocol (sans-I/O): CopyOutResponse / CopyData / CopyDone for COPY TO STDOUT, and
CopyInResponse then the client's CopyData / CopyDone / CopyFail for COPY FROM STDIN.

COPY TO: `write_copy_out` writes the whole stream into `out`, calling `flush` (the transport's
"write what is pending now") between payloads once enough is pending, so a never-ending stream
(COPY (SUBSCRIBE ...) TO STDOUT) reaches the client as it goes.

COPY FROM: `CopyIn` accumulates CopyData up to a size limit (53000 beyond it); at CopyDone it
decodes the rows (22P04 on bad data) for SessionClient.insert_rows; CopyFail aborts with 57014.
The connection routes messages to it while in its COPY_IN state.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from headrace.coordinator.responses import CopyFrom, CopyTo
from headrace.errors import HeadraceError, QueryCanceled
from headrace.pgwire.copy_format import decode_copy_data

MAX_COPY_FROM_BYTES = 64 << 20  # buffered per COPY FROM; more is 53000 (as Materialize's max_copy_from_size)
FLUSH_THRESHOLD = 64 * 1024

_INT16 = struct.Struct("!h")
_INT32 = struct.Struct("!i")

Flush = Callable[[], Awaitable[None]]


# --- backend messages -----------------------------------------------------------------------

def _copy_response(type_byte: bytes, format_code: int, column_count: int) -> bytes:
    body = bytes([format_code]) + _INT16.pack(column_count) + _INT16.pack(format_code) * column_count
    return type_byte + _INT32.pack(len(body) + 4) + body


def copy_out_response(format_code: int, column_count: int) -> bytes:
    return _copy_response(b"H", format_code, column_count)


def copy_in_response(format_code: int, column_count: int) -> bytes:
    return _copy_response(b"G", format_code, column_count)


def copy_data(payload: bytes) -> bytes:
    return b"d" + _INT32.pack(len(payload) + 4) + payload


def copy_done() -> bytes:
    return b"c\0\0\0\4"


def _command_complete(tag: str) -> bytes:
    body = tag.encode() + b"\0"
    return b"C" + _INT32.pack(len(body) + 4) + body


# --- COPY TO ----------------------------------------------------------------------------------

async def write_copy_out(out: bytearray, response: CopyTo, cancel: asyncio.Event, flush: Flush | None) -> None:
    """CopyOutResponse, every payload as CopyData, CopyDone, CommandComplete("COPY n").

    A cancel (or an error from the stream) mid-way raises after some CopyData went out; that is
    how PostgreSQL ends a failed COPY TO too (ErrorResponse instead of CopyDone)."""
    out += copy_out_response(response.options.format_code, len(response.columns))
    iterator = response.data.__aiter__()
    try:
        while True:
            if cancel.is_set():
                raise QueryCanceled("canceling statement due to user request")
            next_batch = asyncio.ensure_future(iterator.__anext__())
            if not next_batch.done():
                if flush is not None and out:
                    await flush()  # the client sees what is ready while the stream waits
                cancelled = asyncio.ensure_future(cancel.wait())
                try:
                    await asyncio.wait({next_batch, cancelled}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    cancelled.cancel()
                if not next_batch.done():
                    next_batch.cancel()
                    raise QueryCanceled("canceling statement due to user request")
            try:
                payloads = next_batch.result()
            except StopAsyncIteration:
                break
            pack = _INT32.pack
            out += b"".join(b"d" + pack(len(payload) + 4) + payload for payload in payloads if payload)
            if flush is not None and len(out) >= FLUSH_THRESHOLD:
                await flush()
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()
    out += copy_done()
    out += _command_complete(response.tag)


# --- COPY FROM --------------------------------------------------------------------------------

@dataclass
class CopyIn:
    """One COPY FROM STDIN in progress. `remaining_sql` holds the statements of the same simple
    Query after the COPY (None when the COPY came through the extended protocol)."""

    response: CopyFrom
    remaining_sql: str | None
    limit: int = MAX_COPY_FROM_BYTES
    buffer: bytearray = field(default_factory=bytearray)

    @property
    def extended(self) -> bool:
        return self.remaining_sql is None

    def receive(self, payload: bytes) -> None:
        if len(self.buffer) + len(payload) > self.limit:
            raise HeadraceError(f"COPY FROM STDIN data exceeds the maximum size of {self.limit} bytes",
                                sqlstate="53000", hint="split the data into several COPY statements")
        self.buffer += payload

    def rows(self) -> list[tuple[Any, ...]]:
        response = self.response
        schema, name = response.target
        return decode_copy_data(response.options, bytes(self.buffer), [column.type_oid for column in response.columns],
                                [column.name for column in response.columns], relation=name)

    @staticmethod
    def failed(message: str) -> HeadraceError:
        return QueryCanceled(f"COPY from stdin failed: {message}")


def start_copy_in(out: bytearray, response: CopyFrom, remaining_sql: str | None) -> CopyIn:
    out += copy_in_response(response.options.format_code, len(response.columns))
    return CopyIn(response, remaining_sql)


def is_copy_response(result: object) -> bool:
    return isinstance(result, (CopyTo, CopyFrom))


async def start_copy(out: bytearray, result: CopyTo | CopyFrom, cancel: asyncio.Event, flush: Flush | None,
                     remaining_sql: str | None) -> CopyIn | None:
    """A COPY's execute answered: stream a COPY TO out completely (None), or open the COPY FROM
    whose data the client sends next (the connection enters its COPY_IN state)."""
    if isinstance(result, CopyTo):
        await write_copy_out(out, result, cancel, flush)
        return None
    return start_copy_in(out, result, remaining_sql)
