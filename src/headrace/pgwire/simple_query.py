"""The simple query protocol: one Query message, possibly several statements."""

from __future__ import annotations

import asyncio

from headrace.coordinator.responses import SendingRows, Subscribing
from headrace.pgwire import messages
from headrace.pgwire.copy import CopyIn, Flush, is_copy_response, start_copy
from headrace.pgwire.interfaces import SessionClient
from headrace.pgwire.results import WatchPeer, send_rows, stream_subscription
from headrace.pgwire.types import TEXT_FORMAT

UNNAMED = ""


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
