"""A SELECT's rows handed out in pieces: what a portal has not returned yet, and the part still in the store.

A client that asks for every row (Execute with max_rows 0, a simple Query) of a large result must not make the server
hold the whole result: the rows stay in the store (DuckDB produces them as they are fetched; the store PostgreSQL sends
them in libpq's chunks) and the protocol layer takes them `STREAM_CHUNK_ROWS` at a time, writing each piece to the
socket and waiting for it to drain before asking for the next (`SendingRows.more`): memory is bounded by a piece and
the socket's buffer, and a slow reader slows the query, as PostgreSQL's own portal does.

An Execute with max_rows > 0 (a JDBC fetch size), a cursor's FETCH, COPY TO and the HTTP API take the whole result,
as before: a portal suspended between Executes would hold a store connection across the client's other statements."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import duckdb

from headrace.coordinator.responses import Column, SendingRows
from headrace.errors import QueryCanceled
from headrace.store.query import fetch_rows

if TYPE_CHECKING:
    from headrace.coordinator.session import Portal
    from headrace.store.backend import BackendConnection

STREAM_CHUNK_ROWS = 8192

Row = tuple[Any, ...]
RunOnThread = Callable[..., Awaitable[Any]]


class RowStream(Protocol):
    """The rest of a result, still in the store."""

    tag_verb: str
    done: bool

    async def next_chunk(self, cancel: asyncio.Event) -> list[Row]: ...

    def final_tag(self, rows_sent: int) -> str: ...

    def close(self) -> None: ...


async def interruptible(work: Awaitable[Any], cancel: asyncio.Event, interrupt: Callable[[], Any]) -> Any:
    """`work`'s result; a cancel (CancelRequest, statement_timeout) first calls `interrupt` and ends in 57014."""
    running = asyncio.ensure_future(work)
    cancelled = asyncio.ensure_future(cancel.wait())
    try:
        done, _ = await asyncio.wait({running, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        if running in done:
            return running.result()
        interrupt()
        try:
            await running
        except Exception:  # noqa: BLE001 - the interrupt's own error is replaced by 57014
            pass
        raise QueryCanceled("canceling statement due to user request")
    finally:
        cancelled.cancel()


class StoreRowStream:
    """A query still running in DuckDB, its cursor held until the last row or the portal's close."""

    tag_verb = "SELECT"

    def __init__(self, result: duckdb.DuckDBPyConnection, columns: tuple[Column, ...], run: RunOnThread,
                 release: Callable[[bool], None]) -> None:
        self._result = result
        self._columns = columns
        self._run = run
        self._release: Callable[[bool], None] | None = release
        self._interrupted = False
        self.done = False

    async def next_chunk(self, cancel: asyncio.Event) -> list[Row]:
        rows: list[Row] = await interruptible(self._run(fetch_rows, self._result, self._columns, STREAM_CHUNK_ROWS),
                                              cancel, self._interrupt)
        self.done = len(rows) < STREAM_CHUNK_ROWS
        return rows

    def _interrupt(self) -> None:
        self._interrupted = True
        self._result.interrupt()

    def final_tag(self, rows_sent: int) -> str:
        return f"SELECT {rows_sent}"

    def close(self) -> None:
        if self._release is not None:
            release, self._release = self._release, None
            release(self.done and not self._interrupted)  # a cursor left mid-result is closed, not pooled


class BackendRowStream:
    """A result the store PostgreSQL is still sending on the session's backend connection."""

    def __init__(self, connection: BackendConnection, tag_verb: str,
                 cancellable: Callable[[asyncio.Event, Awaitable[Any]], Awaitable[Any]],
                 abandon: Callable[[], None]) -> None:
        self._connection = connection
        self._cancellable = cancellable
        self._abandon: Callable[[], None] | None = abandon
        self.tag_verb = tag_verb
        self.done = False
        self._tag = ""

    async def next_chunk(self, cancel: asyncio.Event) -> list[Row]:
        chunk = await self._cancellable(cancel, self._connection.next_chunk())
        if not chunk.more:
            self.done, self._tag = True, chunk.tag
        return list(chunk.rows)

    def final_tag(self, rows_sent: int) -> str:
        return self._tag or f"{self.tag_verb} {rows_sent}"  # PostgreSQL's own ("SELECT 50000000")

    def close(self) -> None:
        if self._abandon is not None and not self.done:
            self._abandon()  # the backend is mid-result: it cannot serve the session's next statement
        self._abandon = None


def next_rows(portal: Portal, max_rows: int, tag_verb: str = "SELECT", tag: str | None = None) -> SendingRows:
    """The portal's next rows: up to `max_rows` of those held (PortalSuspended after them), then, when the rest is
    still in the store, `more` (the caller asks again with `continue_stream`)."""
    assert portal.pending_rows is not None and portal.columns is not None
    if max_rows > 0 and len(portal.pending_rows) > max_rows:
        batch, portal.pending_rows = portal.pending_rows[:max_rows], portal.pending_rows[max_rows:]
        portal.rows_sent += len(batch)
        return SendingRows(portal.columns, batch, tag_verb, suspended=True)
    batch, portal.pending_rows = portal.pending_rows, []
    portal.rows_sent += len(batch)
    if portal.row_stream is not None:
        return SendingRows(portal.columns, batch, tag_verb, more=True)
    portal.finished = True
    return SendingRows(portal.columns, batch, tag_verb, tag=tag)


async def continue_stream(portal: Portal, cancel: asyncio.Event) -> SendingRows:
    """The next piece of a portal's streamed result; an error met producing it ends the portal."""
    stream = portal.row_stream
    assert stream is not None and portal.columns is not None
    try:
        rows = await stream.next_chunk(cancel)
    except BaseException:
        portal.close()
        portal.finished = True
        raise
    portal.rows_sent += len(rows)
    if not stream.done:
        return SendingRows(portal.columns, rows, stream.tag_verb, more=True)
    portal.close()
    portal.finished = True
    return SendingRows(portal.columns, rows, stream.tag_verb, tag=stream.final_tag(portal.rows_sent))
