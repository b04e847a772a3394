"""What the coordinator hands back to the protocol layers (seed 004).

Values in rows are plain Python objects (None, bool, int, float, Decimal, str, bytes, datetime, date,
dict/list for json) and each column names its PostgreSQL type OID; the protocol layer encodes them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from headrace.errors import Notice
from headrace.pgwire.copy_format import CopyOptions


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    type_size: int = -1
    type_modifier: int = -1
    # -1: the column's values are Python objects the protocol layer encodes. 0 or 1: they are already wire bytes,
    # PostgreSQL's own text (0) or binary (1) form, as the store PostgreSQL sent them (coordinator/passthrough.py).
    raw_format: int = -1


@dataclass(frozen=True, slots=True)
class StatementDescription:
    """The result of planning a prepared statement: its parameter types and output columns.

    `columns` is None for statements that return no rows (PostgreSQL's NoData)."""

    param_types: tuple[int, ...]
    columns: tuple[Column, ...] | None
    # The statement runs on the store PostgreSQL (coordinator/passthrough.py), which decodes its parameters
    # itself: the protocol layers bind them as (format code, bytes) pairs, as the client sent them.
    raw_parameters: bool = False


@dataclass(slots=True)
class SendingRows:
    """A SELECT's rows: all of them, or (`more`) a piece of a large result the protocol layer streams."""

    columns: tuple[Column, ...]
    rows: Sequence[tuple[Any, ...]]
    tag_verb: str = "SELECT"  # the CommandComplete tag is f"{tag_verb} {row count}"
    suspended: bool = False  # Execute hit max_rows and the portal has more rows (PortalSuspended)
    tag: str | None = None  # the whole CommandComplete tag when it carries no row count (PostgreSQL's EXPLAIN)
    # More rows follow, still in the store: the protocol layer writes these, then executes the portal again for the
    # next piece (coordinator/row_streams.py); no PortalSuspended, no CommandComplete yet.
    more: bool = False

    @property
    def command_tag(self) -> str:
        return self.tag if self.tag is not None else f"{self.tag_verb} {len(self.rows)}"


@dataclass(frozen=True, slots=True)
class CommandComplete:
    """A statement that finished inside the coordinator; `tag` is the PostgreSQL command tag."""

    tag: str
    notices: tuple[str | Notice, ...] = field(default=())
    # Reported session variables the statement changed, (name as reported, value): the protocol
    # layers announce them (pgwire ParameterStatus, WebSocket ParameterStatus).
    parameters: tuple[tuple[str, str], ...] = field(default=())


@dataclass(frozen=True, slots=True)
class EmptyQuery:
    """The statement text held no statement (PostgreSQL's EmptyQueryResponse)."""


@dataclass(slots=True)
class Subscribing:
    """A stream of row batches (SUBSCRIBE): `batches` yields each batch as it is committed and ends
    when the subscription finishes (e.g. UP TO reached). `cancel` stops it and releases what it
    holds; call it when the client goes away, cancels, or the cursor over it is closed."""

    columns: tuple[Column, ...]
    batches: AsyncIterator[Sequence[tuple[Any, ...]]]
    cancel: Callable[[], None]


@dataclass(slots=True)
class CopyTo:
    """COPY ... TO STDOUT: `data` yields batches of CopyData payloads, one payload per row as
    PostgreSQL sends them (header and trailer included); `row_count` counts the rows written so
    far, so the tag is right once `data` is exhausted."""

    options: CopyOptions
    columns: tuple[Column, ...]
    data: AsyncIterator[Sequence[bytes]]
    row_count: int = 0

    @property
    def tag(self) -> str:
        return f"COPY {self.row_count}"


@dataclass(frozen=True, slots=True)
class CopyFrom:
    """COPY <target> FROM STDIN: the protocol layer collects the data in `options`' format, decodes
    it into rows of `columns` (Python values) and hands them to SessionClient.insert_rows."""

    target: tuple[str, str]  # (schema, name)
    columns: tuple[Column, ...]
    options: CopyOptions
    # A relation only the store PostgreSQL keeps: the data goes to its COPY as the client sent it, undecoded
    # (SessionClient.relay_copy; coordinator/passthrough.py), and PostgreSQL parses it.
    relay: bool = False


@dataclass(frozen=True, slots=True)
class Fetch:
    """FETCH: the session executes cursor `name` for `count` rows (None = all), waiting up to
    `timeout_s` (None = until at least one row) for a streaming cursor. The protocol layers never
    see it: SessionClient.execute runs the inner execute and returns its rows tagged FETCH."""

    name: str
    count: int | None
    timeout_s: float | None
    direction: str = "forward"  # or backward, absolute, relative (coordinator/cursors.py ScrollRows)
    move: bool = False  # MOVE: the cursor moves, no rows are sent (tag MOVE n)


ExecuteResponse = SendingRows | CommandComplete | EmptyQuery | Subscribing | CopyTo | CopyFrom | Fetch
