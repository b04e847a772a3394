"""What the coordinator hands back to the protocol layers (seed 004).

Values in rows are plain Python objects (None, bool, int, float, Decimal, str, bytes, datetime, date,
dict/list for json) and each column names its PostgreSQL type OID; the protocol layer encodes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    type_size: int = -1
    type_modifier: int = -1


@dataclass(frozen=True, slots=True)
class StatementDescription:
    """The result of planning a prepared statement: its parameter types and output columns.

    `columns` is None for statements that return no rows (PostgreSQL's NoData)."""

    param_types: tuple[int, ...]
    columns: tuple[Column, ...] | None


@dataclass(slots=True)
class SendingRows:
    """A SELECT's result: every row is available at once (not a streaming API, see seed 004)."""

    columns: tuple[Column, ...]
    rows: Sequence[tuple[Any, ...]]
    tag_verb: str = "SELECT"  # the CommandComplete tag is f"{tag_verb} {row count}"
    suspended: bool = False  # Execute hit max_rows and the portal has more rows (PortalSuspended)


@dataclass(frozen=True, slots=True)
class CommandComplete:
    """A statement that finished inside the coordinator; `tag` is the PostgreSQL command tag."""

    tag: str
    notices: tuple[str, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class EmptyQuery:
    """The statement text held no statement (PostgreSQL's EmptyQueryResponse)."""


ExecuteResponse = SendingRows | CommandComplete | EmptyQuery
