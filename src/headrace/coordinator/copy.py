"""COPY in the coordinator: COPY ... TO STDOUT wraps the inner statement's rows or stream into a
CopyTo (seed 004), COPY ... FROM STDIN names its target and columns in a CopyFrom, and the rows the
protocol layer decoded come back through a CopyTargets (tables plug in there)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from headrace.catalog.catalog import Catalog
from headrace.coordinator.responses import Column, CopyTo, SendingRows, Subscribing
from headrace.coordinator.session import Session
from headrace.errors import HeadraceError, UndefinedObject
from headrace.pgwire.copy_format import CopyEncoder, CopyOptions


class CopyTargets(Protocol):
    """Where COPY FROM writes. The tables issue provides the real one; until then nothing is."""

    def copy_columns(self, schema: str, name: str, columns: Sequence[str]) -> tuple[Column, ...]:
        """The columns the data holds, in order (all of the target's when `columns` is empty).
        Raises 42P01 for an unknown relation, 42809 when it cannot be written, 42703 unknown column."""
        ...

    async def insert_rows(self, session: Session, target: tuple[str, str], columns: Sequence[Column],
                          rows: list[tuple[Any, ...]]) -> int:
        """Write the rows (atomically at COMMIT inside a transaction block); returns how many."""
        ...


class SourcesAreNotTables:
    """The CopyTargets before tables exist: every relation is refused with a clear error."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    def copy_columns(self, schema: str, name: str, columns: Sequence[str]) -> tuple[Column, ...]:
        if self._catalog.find(schema, name) is None:
            raise UndefinedObject(f'relation "{name}" does not exist')
        raise HeadraceError(f'"{name}" is not a table', sqlstate="42809",
                            detail=f'"{name}" is a source: it takes data from its webhook endpoint only')

    async def insert_rows(self, session: Session, target: tuple[str, str], columns: Sequence[Column],
                          rows: list[tuple[Any, ...]]) -> int:
        self.copy_columns(*target, [column.name for column in columns])
        raise AssertionError("unreachable: copy_columns refuses every target")


def copy_to(options: CopyOptions, inner: SendingRows | Subscribing) -> CopyTo:
    """COPY (query | SUBSCRIBE) TO STDOUT over the inner execute's response: one payload per row,
    as PostgreSQL sends them (the binary header rides with the first)."""
    encoder = CopyEncoder(options, [column.type_oid for column in inner.columns],
                          [column.name for column in inner.columns], [column.raw_format for column in inner.columns])
    response = CopyTo(options=options, columns=inner.columns, data=_empty())
    if isinstance(inner, SendingRows):
        response.data = _rows_payloads(response, encoder, [inner.rows])
    else:
        response.data = _stream_payloads(response, encoder, inner)
    return response


ROWS_PER_BATCH = 1000  # payloads handed to the protocol layer at once


async def _empty() -> AsyncIterator[Sequence[bytes]]:
    return
    yield []  # pragma: no cover - makes this an async generator


async def _rows_payloads(response: CopyTo, encoder: CopyEncoder,
                         batches: Sequence[Sequence[tuple[Any, ...]]]) -> AsyncIterator[Sequence[bytes]]:
    # The header rides with the first row: psycopg reads the binary signature and the first tuple
    # from one CopyData, as PostgreSQL sends them.
    pending = encoder.header()
    encode = encoder.row
    for batch in batches:
        for start in range(0, len(batch), ROWS_PER_BATCH):
            chunk = batch[start:start + ROWS_PER_BATCH]
            payloads = [encode(row) for row in chunk]
            if pending:
                payloads[0], pending = pending + payloads[0], b""
            response.row_count += len(chunk)
            yield payloads
    last = pending + encoder.trailer()
    if last:
        yield [last]


async def _stream_payloads(response: CopyTo, encoder: CopyEncoder, inner: Subscribing) -> AsyncIterator[Sequence[bytes]]:
    pending = encoder.header()
    try:
        async for batch in inner.batches:
            if not batch:
                continue
            payloads = [encoder.row(row) for row in batch]
            if pending:
                payloads[0], pending = pending + payloads[0], b""
            response.row_count += len(batch)
            yield payloads
        last = pending + encoder.trailer()
        if last:
            yield [last]
    finally:
        inner.cancel()
