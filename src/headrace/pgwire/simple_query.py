"""The simple query protocol: one Query message, possibly several statements.

Several statements outside a transaction block run as one implicit transaction, as in PostgreSQL: a statement that
fails undoes the ones before it (a table's writes reach its log only at the end; PostgreSQL's own statements run in
one transaction of the session's store backend) and the session is idle again after the error. A string that
controls its transactions itself (BEGIN, COMMIT, SAVEPOINT, ...), or holds a COPY or a SUBSCRIBE (whose data
and rows flow between the client's messages), runs each statement on its own as before. headrace's own DDL
(CREATE SOURCE, CREATE MATERIALIZED VIEW, ...) is not transactional and stays done."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Sequence

from headrace.coordinator.responses import SendingRows, Subscribing
from headrace.pgwire import messages
from headrace.pgwire.copy import CopyIn, Flush, is_copy_response, start_copy
from headrace.pgwire.interfaces import SessionClient
from headrace.pgwire.results import WatchPeer, send_rows, stream_subscription
from headrace.pgwire.types import TEXT_FORMAT

UNNAMED = ""
_LEADING_COMMENTS = re.compile(r"^(?:\s|--[^\n]*(?:\n|$)|/\*.*?\*/)*", re.DOTALL)
_OWN_TRANSACTION = re.compile(
    r"(?:begin|start|commit|end|rollback|abort|savepoint|release|prepare\s+transaction|copy|subscribe)\b",
    re.IGNORECASE)


async def run_simple_query(session: SessionClient, sql: str, out: bytearray, cancel: asyncio.Event,
                           flush: Flush | None = None, watch_peer: WatchPeer | None = None) -> CopyIn | None:
    """Run each statement in order through the unnamed statement and portal, writing
    RowDescription + DataRows + CommandComplete (text format) per statement.

    Raises the first statement's error: results of the statements before it are already in `out`
    and the rest are not run. The caller writes the ErrorResponse and the one ReadyForQuery.
    A COPY FROM returns its CopyIn (holding the statements after it) instead: the caller collects
    the client's data before going on."""
    single = single_statement(sql)
    statements = [single] if single is not None else await session.split_statements_off_loop(sql)
    if not statements:
        out += messages.empty_query_response()
        return None
    async with implicit_transaction(session, statements, cancel):
        return await _run_statements(session, statements, out, cancel, flush, watch_peer)


@contextlib.asynccontextmanager
async def implicit_transaction(session: SessionClient, statements: Sequence[str],
                               cancel: asyncio.Event) -> AsyncIterator[None]:
    """Several statements: parsed whole first (a syntax error runs nothing), then run inside one implicit
    transaction unless the session is in a block or a statement runs on its own (module docstring): committed
    when the body ends, rolled back when it raises. The simple Query and the HTTP SQL API share it."""
    if len(statements) > 1:
        await session.check_syntax(statements)
    if len(statements) < 2 or session.transaction_status != "I" or any(map(runs_on_its_own, statements)):
        yield
        return
    await _run_silently(session, "BEGIN", cancel)
    try:
        yield
        await _run_silently(session, "COMMIT", cancel)
    except BaseException:
        if session.transaction_status != "I":  # a COMMIT that failed has already ended the block's writes
            with contextlib.suppress(Exception):  # the statement's own error is the one to report
                await _run_silently(session, "ROLLBACK", cancel)
        raise


def runs_on_its_own(statement: str) -> bool:
    """A statement that keeps a multi-statement string out of one implicit transaction (module docstring)."""
    return _OWN_TRANSACTION.match(_LEADING_COMMENTS.sub("", statement, count=1)) is not None


async def _run_silently(session: SessionClient, sql: str, cancel: asyncio.Event) -> None:
    """BEGIN / COMMIT / ROLLBACK of the implicit transaction: no CommandComplete of its own."""
    await session.prepare(UNNAMED, sql, (), describe=False)
    session.bind(UNNAMED, UNNAMED, ())
    await session.execute(UNNAMED, 0, cancel)


async def _run_statements(session: SessionClient, statements: list[str], out: bytearray, cancel: asyncio.Event,
                          flush: Flush | None, watch_peer: WatchPeer | None) -> CopyIn | None:
    for index, statement in enumerate(statements):
        await session.prepare(UNNAMED, statement, (), describe=False)
        session.bind(UNNAMED, UNNAMED, ())
        result = await session.execute(UNNAMED, 0, cancel, stream=flush is not None)
        if is_copy_response(result):  # COPY TO streams now; COPY FROM waits for the client's data
            copy_in = await start_copy(out, result, cancel, flush, ";".join(statements[index + 1:]))  # type: ignore[arg-type]
            if copy_in is not None:
                return copy_in
            continue
        if isinstance(result, Subscribing):  # streams until UP TO or a cancel
            await stream_subscription(out, result, (TEXT_FORMAT,) * len(result.columns), with_row_description=True,
                                      cancel=cancel, flush=flush, watch_peer=watch_peer)
            continue
        column_count = len(result.columns) if isinstance(result, SendingRows) else 0
        await send_rows(out, result, (TEXT_FORMAT,) * column_count, with_row_description=True,
                        next_piece=lambda: session.execute(UNNAMED, 0, cancel, stream=True), flush=flush)
    return None


def single_statement(sql: str) -> str | None:
    """The text of a Query holding exactly one statement, found without tokenizing (a point SELECT spends
    more in sqlglot's tokenizer than in the fast path): no semicolon but trailing ones, no comment.
    None: let the tokenizer split it."""
    text = sql.strip()
    while text.endswith(";"):
        text = text[:-1].rstrip()
    if not text or ";" in text or "--" in text or "/*" in text:
        return None
    return text
