"""One SQL session's own connection to the store PostgreSQL (its "backend"), at the libpq level.

The coordinator forwards to it every statement that is not headrace's own (coordinator/passthrough.py), so the
answer is PostgreSQL's: its rows come back as the bytes PostgreSQL sent, in the format asked for, with the column
types and type modifiers PostgreSQL described, and its errors with every field PostgreSQL gave. Nothing here
decodes a value: a cell goes from PostgreSQL's DataRow to the client's unchanged.

libpq in non-blocking mode, driven by psycopg's own generators and waited on by the event loop: no thread per
statement. The socket stays registered with the loop between statements (`SocketWaiter`): psycopg's wait_async adds
and removes it, and arms a timer, at every wait, two epoll_ctl calls and a timer per statement that cost a
passthrough statement a tenth of its time on headrace's side. One call at a time per connection (the coordinator's
possession rule); `close()` on the event loop's thread. `cancel()` blocks (it opens a connection to send
PostgreSQL's CancelRequest): call it on a thread."""

from __future__ import annotations

import asyncio
import select
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg import generators, pq
from psycopg.abc import PQGen
from psycopg.waiting import READY_R, READY_W, WAIT_R, WAIT_W

from headrace.errors import HeadraceError, Notice
from headrace.metrics.store import STORE

TEXT_FORMAT = 0
BINARY_FORMAT = 1

_DIAGNOSTIC = pq.DiagnosticField
_COPY_CHUNK = 128 * 1024
_COPY_STATES = (pq.ExecStatus.COPY_IN, pq.ExecStatus.COPY_OUT, pq.ExecStatus.COPY_BOTH)


@dataclass(frozen=True, slots=True)
class BackendColumn:
    name: str
    type_oid: int
    type_size: int
    type_modifier: int


@dataclass(frozen=True, slots=True)
class BackendDescription:
    """What PostgreSQL says a statement takes and returns: columns is None when it returns no rows."""

    param_types: tuple[int, ...]
    columns: tuple[BackendColumn, ...] | None


@dataclass(slots=True)
class BackendResult:
    tag: str
    columns: tuple[BackendColumn, ...] | None  # None: the statement returns no rows
    rows: list[tuple[bytes | None, ...]]
    result_format: int
    notices: list[Notice] = field(default_factory=list)
    more: bool = False  # chunked: rows follow, read them with `next_chunk` (the tag comes with the last chunk)


class BackendError(HeadraceError):
    """An error PostgreSQL reported, with its own SQLSTATE and fields."""

    def __init__(self, result: pq.PGresult | None, fallback: str) -> None:
        def text(code: pq.DiagnosticField) -> str | None:
            value = result.error_field(code) if result is not None else None
            return value.decode("utf-8", "replace") if value else None

        sqlstate = text(_DIAGNOSTIC.SQLSTATE) or "08006"
        position = text(_DIAGNOSTIC.STATEMENT_POSITION)
        super().__init__(text(_DIAGNOSTIC.MESSAGE_PRIMARY) or fallback, detail=text(_DIAGNOSTIC.MESSAGE_DETAIL),
                         hint=text(_DIAGNOSTIC.MESSAGE_HINT), position=int(position) if position else None,
                         sqlstate=sqlstate, http_status=_http_status(sqlstate))
        self.severity = text(_DIAGNOSTIC.SEVERITY_NONLOCALIZED) or "ERROR"
        self.context = text(_DIAGNOSTIC.CONTEXT)


Returned = TypeVar("Returned")


class SocketWaiter:
    """Runs psycopg's generators for one connection's socket on the event loop. The reader stays registered while
    the connection is used; one that fires with nobody waiting (a notice or a close between statements) is removed,
    since the loop's epoll is level-triggered and would call it again at every turn, and added back at the next
    wait. Writes almost never wait (libpq's buffer takes a statement): the socket is polled once, then waited on."""

    def __init__(self, fileno: int) -> None:
        self._fileno = fileno
        self._loop: asyncio.AbstractEventLoop | None = None  # whose reader is registered, if any
        self._readable: asyncio.Future[None] | None = None

    async def run(self, generator: PQGen[Returned]) -> Returned:
        try:
            wanted = next(generator)
            while True:
                ready = await (self._wait_readable() if wanted == WAIT_R else self._wait_writable(wanted))
                wanted = generator.send(ready)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        except OSError as exc:  # the socket was closed under the wait
            raise psycopg.OperationalError("connection socket closed") from exc

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop the socket is registered with, if any."""
        return self._loop

    def stop(self) -> None:
        """No more waits (the connection closes next): forget the socket. On the loop's thread."""
        if self._loop is not None:
            self._loop.remove_reader(self._fileno)
            self._loop = None

    async def _wait_readable(self) -> int:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self.stop()
            loop.add_reader(self._fileno, self._on_readable)
            self._loop = loop
        self._readable = loop.create_future()
        try:
            await self._readable
        finally:
            self._readable = None
        return READY_R

    def _on_readable(self) -> None:
        waiting = self._readable
        if waiting is None:
            self.stop()
        elif not waiting.done():
            waiting.set_result(None)

    async def _wait_writable(self, wanted: int) -> int:
        readable, writable, _ = select.select([self._fileno] if wanted & WAIT_R else [], [self._fileno], [], 0)
        if writable or readable:
            return (READY_R if readable else 0) | (READY_W if writable else 0)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        loop.add_writer(self._fileno, lambda: done.done() or done.set_result(None))
        try:
            await done
        finally:
            loop.remove_writer(self._fileno)
        return READY_W


def _running_in(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:  # no loop runs on this thread
        return False


def _http_status(sqlstate: str) -> int:
    if sqlstate.startswith(("08", "53", "57P", "58", "XX")):
        return 503 if sqlstate.startswith(("08", "53", "57P")) else 500
    return 400


class BackendConnection:
    """A libpq connection as one role; see the module docstring. Make one with `await BackendConnection.open()`."""

    def __init__(self, pgconn: pq.PGconn) -> None:
        self._pgconn = pgconn
        self._pgconn.nonblocking = 1
        self._waiter = SocketWaiter(pgconn.socket)
        self._cancel = self._pgconn.get_cancel()
        self._notices: list[Notice] = []
        self._pgconn.notice_handler = self._on_notice
        self._copying = False  # between start_copy_in and finish_copy_in
        self._chunk_format = TEXT_FORMAT  # the result format of the chunked result being read
        self._chunk_tag = ""  # and its command tag, once libpq gave it

    @classmethod
    async def open(cls, conninfo: str) -> BackendConnection:
        return cls(await asyncio.to_thread(_connect, conninfo))  # libpq's connect blocks: once per session

    @property
    def backend_pid(self) -> int:
        return self._pgconn.backend_pid

    @property
    def in_transaction(self) -> bool:
        """A transaction block is open (or failed) on the backend."""
        return self._pgconn.transaction_status in (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR)

    @property
    def busy(self) -> bool:
        """A statement was sent and its results not all read (a client went away mid-statement)."""
        return self._pgconn.transaction_status == pq.TransactionStatus.ACTIVE

    @property
    def closed(self) -> bool:
        return self._pgconn.status != pq.ConnStatus.OK

    async def describe(self, sql: str, param_types: Sequence[int]) -> BackendDescription:
        """Parse `sql` as the unnamed statement and describe it (Parse + Describe S)."""
        self._pgconn.send_prepare(b"", sql.encode(), list(param_types) or None)
        self._check(await self._results())
        self._pgconn.send_describe_prepared(b"")
        described = self._check(await self._results())
        params = tuple(described.param_type(i) for i in range(described.nparams))
        return BackendDescription(params, _columns(described) if described.nfields else None)

    async def execute(self, sql: str, params: Sequence[bytes | None] = (), param_types: Sequence[int] = (),
                      param_formats: Sequence[int] = (), result_format: int = TEXT_FORMAT,
                      chunk_rows: int = 0) -> BackendResult:
        """Run one statement with its parameters as the client sent them, rows in `result_format`. With
        `chunk_rows`, a result of more rows than that comes in pieces (libpq's chunked mode): the first here with
        `more` set, the others from `next_chunk`, so no more than a chunk is held at once."""
        self._notices = []
        STORE.statement()  # headrace_store_statements (metrics/store.py)
        if params or param_types or result_format != TEXT_FORMAT:
            self._pgconn.send_query_params(sql.encode(), list(params), list(param_types) or None,
                                           list(param_formats) or None, result_format)
        else:
            self._pgconn.send_query(sql.encode())  # simple protocol: one round trip, no Parse
        if chunk_rows <= 0:
            return self._result(self._check(await self._results()), result_format)
        self._pgconn.set_chunked_rows_mode(chunk_rows)
        first = await self._wait(generators.send(self._pgconn), generators.fetch(self._pgconn))
        if first is not None and first.status == pq.ExecStatus.TUPLES_CHUNK:
            self._chunk_format, self._chunk_tag = result_format, ""
            chunk = await self._chunk(first)
            if len(chunk.rows) < chunk_rows:  # a short chunk is the last one: the whole result, in one answer
                end = await self.next_chunk()
                end.rows = chunk.rows + end.rows
                return end
            return chunk
        return self._result(self._check(await self._results(sent=True, first=first)), result_format)

    async def next_chunk(self) -> BackendResult:
        """The next piece of a chunked result (`execute`'s `more`); the last one has `more` False and the tag."""
        result = await self._wait(generators.fetch(self._pgconn))
        if result is None:  # cannot happen after a chunk: libpq ends a result set with its TUPLES_OK
            raise HeadraceError("the store PostgreSQL ended a result early", sqlstate="08006", http_status=503)
        return await self._chunk(result)

    async def _chunk(self, result: pq.PGresult) -> BackendResult:
        if result.status == pq.ExecStatus.TUPLES_CHUNK:
            chunk = self._result(result, self._chunk_format)
            chunk.more = True
            self._chunk_tag = chunk.tag or self._chunk_tag  # libpq hands the tag over with the last rows
            return chunk
        # The end of the result set (TUPLES_OK, no rows) or an error met after some rows: what follows up to the
        # end of the statement is read too, so the connection is ready for the next one.
        last = self._result(self._check(await self._results(sent=True, first=result)), self._chunk_format)
        last.tag, self._chunk_tag = last.tag or self._chunk_tag, ""
        return last

    async def _wait(self, *steps: generators.PQGen[Any]) -> Any:
        value = None
        try:
            for step in steps:
                value = await self._waiter.run(step)
        except psycopg.OperationalError as exc:
            raise HeadraceError(f"lost the connection to the store PostgreSQL: {exc}", sqlstate="08006",
                                http_status=503) from None
        return value

    def _result(self, result: pq.PGresult, result_format: int) -> BackendResult:
        rows = [tuple(result.get_value(r, c) for c in range(result.nfields)) for r in range(result.ntuples)]
        returns_rows = result.status in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.TUPLES_CHUNK)
        return BackendResult((result.command_status or b"").decode(), _columns(result) if returns_rows else None,
                             rows, result_format, self._notices)

    async def start_copy_in(self, sql: str) -> tuple[int, int]:
        """Send a `COPY ... FROM STDIN` (as the client wrote it) and leave the backend waiting for its data:
        (overall format, column count) of PostgreSQL's CopyInResponse, for the client's. Then `finish_copy_in`."""
        self._notices = []
        self._pgconn.send_query(sql.encode())
        try:
            results = await self._waiter.run(generators.execute(self._pgconn))
        except psycopg.OperationalError as exc:
            raise HeadraceError(f"lost the connection to the store PostgreSQL: {exc}", sqlstate="08006",
                                http_status=503) from None
        if results and results[-1].status == pq.ExecStatus.COPY_IN:
            self._copying = True
            return (BINARY_FORMAT if results[-1].binary_tuples else TEXT_FORMAT), results[-1].nfields
        self._check(results)  # PostgreSQL's error (42P01, 42501 for a server file, ...)
        raise HeadraceError("only COPY ... FROM STDIN is relayed to the store PostgreSQL", sqlstate="0A000")

    @property
    def copying_in(self) -> bool:
        """A relayed COPY FROM STDIN waits for its data (`finish_copy_in` not called: the client went away)."""
        return self._copying

    async def finish_copy_in(self, data: bytes | None, failure: str | None = None) -> BackendResult:
        """The client's COPY data (or its CopyFail message as `failure`, which PostgreSQL turns into its error)
        after `start_copy_in`; PostgreSQL's command tag (`COPY 3`) or its error."""
        self._copying = False
        try:
            view = memoryview(data or b"")
            for start in range(0, len(view), _COPY_CHUNK):  # libpq's queue takes bounded pieces (psycopg #255)
                await self._waiter.run(generators.copy_to(self._pgconn, view[start:start + _COPY_CHUNK]))
            result = await self._waiter.run(generators.copy_end(self._pgconn, None if failure is None
                                                                else failure.encode()))
        except psycopg.Error as exc:  # PostgreSQL's error for the COPY (57014 after a CopyFail is an OperationalError)
            if exc.pgresult is None or self._pgconn.status != pq.ConnStatus.OK:
                raise HeadraceError(f"lost the connection to the store PostgreSQL: {exc}", sqlstate="08006",
                                    http_status=503) from None
            raise BackendError(exc.pgresult, str(exc)) from None
        return BackendResult((result.command_status or b"").decode(), None, [], TEXT_FORMAT, self._notices)

    async def run(self, sql: str) -> None:
        """A statement of headrace's own (BEGIN, COMMIT, a setting): its result is not the client's."""
        self._pgconn.send_query(sql.encode())
        self._check(await self._results())

    def cancel(self) -> None:
        """Ask PostgreSQL to end the running statement (57014); harmless when none runs. Blocks: run on a thread."""
        try:
            self._cancel.cancel()
        except pq.PQerror:
            pass  # the connection is gone: nothing runs

    def close(self) -> None:
        """Close the connection; called on another thread (after a blocking cancel), the close is handed to the
        event loop, whose reader must go before the socket closes and its number is reused."""
        loop = self._waiter.loop
        if loop is not None and not loop.is_closed() and not _running_in(loop):
            loop.call_soon_threadsafe(self.close)
            return
        self._waiter.stop()
        self._pgconn.finish()

    async def _results(self, *, sent: bool = False, first: pq.PGresult | None = None) -> list[pq.PGresult]:
        """The statement's results, up to its end (`sent`: its query is already flushed; `first`: and its first
        result already read)."""
        try:
            if first is not None and first.status in _COPY_STATES:
                results = [first]
            else:
                waiting = generators.fetch_many(self._pgconn) if sent else generators.execute(self._pgconn)
                results = ([first] if first is not None else []) + await self._waiter.run(waiting)
            if results and results[-1].status == pq.ExecStatus.COPY_IN:  # not relayed: refuse it, stay usable
                await self._waiter.run(generators.copy_end(self._pgconn, b"COPY is not relayed to the store"))
                results += await self._waiter.run(generators.fetch_many(self._pgconn))
            elif results and results[-1].status == pq.ExecStatus.COPY_OUT:
                while isinstance(await self._waiter.run(generators.copy_from(self._pgconn)), memoryview):
                    pass
                results += await self._waiter.run(generators.fetch_many(self._pgconn))
            return results
        except psycopg.OperationalError as exc:
            raise HeadraceError(f"lost the connection to the store PostgreSQL: {exc}", sqlstate="08006",
                                http_status=503) from None

    def _on_notice(self, result: pq.PGresult) -> None:
        def text(code: pq.DiagnosticField) -> str | None:
            value = result.error_field(code)
            return value.decode("utf-8", "replace") if value else None

        message = text(_DIAGNOSTIC.MESSAGE_PRIMARY)
        if message:  # PostgreSQL's own severity and SQLSTATE (WARNING 25001, NOTICE 00000 ...)
            self._notices.append(Notice(message, text(_DIAGNOSTIC.SQLSTATE) or "00000",
                                        text(_DIAGNOSTIC.SEVERITY_NONLOCALIZED) or "NOTICE",
                                        text(_DIAGNOSTIC.MESSAGE_DETAIL), text(_DIAGNOSTIC.MESSAGE_HINT)))

    def _check(self, results: list[pq.PGresult]) -> pq.PGresult:
        """The statement's result (the last one), or its error raised as PostgreSQL's."""
        for result in results:
            if result.status in (pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.BAD_RESPONSE,
                                 pq.ExecStatus.NONFATAL_ERROR):
                fallback = self._pgconn.get_error_message().strip() or "the store PostgreSQL failed"
                sqlstate = result.error_field(_DIAGNOSTIC.SQLSTATE)
                STORE.error(sqlstate.decode() if sqlstate else "08006")  # headrace_store_errors (metrics/store.py)
                if self._pgconn.status != pq.ConnStatus.OK:
                    raise HeadraceError(f"lost the connection to the store PostgreSQL: {fallback}",
                                        sqlstate="08006", http_status=503)
                raise BackendError(result, fallback)
            if result.status in (pq.ExecStatus.COPY_IN, pq.ExecStatus.COPY_OUT, pq.ExecStatus.COPY_BOTH):
                raise HeadraceError("COPY of relations kept only by the store PostgreSQL is not supported yet",
                                    sqlstate="0A000", http_status=400)
        if not results:
            raise HeadraceError("the store PostgreSQL returned no result", sqlstate="08006", http_status=503)
        return results[-1]


def _connect(conninfo: str) -> pq.PGconn:
    pgconn = pq.PGconn.connect(conninfo.encode())
    if pgconn.status != pq.ConnStatus.OK:
        message = pgconn.get_error_message().strip() or "could not connect to the store"
        pgconn.finish()
        raise HeadraceError(f"the store PostgreSQL refused the connection: {message}", sqlstate="08001",
                            http_status=503)
    return pgconn


def _columns(result: pq.PGresult) -> tuple[BackendColumn, ...]:
    return tuple(BackendColumn((result.fname(i) or b"").decode(), result.ftype(i), result.fsize(i), result.fmod(i))
                 for i in range(result.nfields))


__all__ = ["BINARY_FORMAT", "TEXT_FORMAT", "BackendColumn", "BackendConnection", "BackendDescription",
           "BackendError", "BackendResult"]
