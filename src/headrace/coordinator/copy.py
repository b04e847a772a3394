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
                          [column.name for column in inner.columns])
    response = CopyTo(options=options, columns=inner.columns, data=_empty())
    if isinstance(inner, SendingRows):
        response.data = _rows_payloads(response, encoder, [inner.rows])
    else:
        response.data = _stream_payloads(response, encoder, inner)
    return response


async def _empty() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover - makes this an async generator


async def _rows_payloads(response: CopyTo, encoder: CopyEncoder,
                         batches: Sequence[Sequence[tuple[Any, ...]]]) -> AsyncIterator[bytes]:
    pending = encoder.header()
    for batch in batches:
        for row in batch:
            payload = encoder.row(row)
            response.row_count += 1
            if pending:
                payload, pending = pending + payload, b""
            yield payload
    if pending:
        yield pending
    trailer = encoder.trailer()
    if trailer:
        yield trailer


async def _stream_payloads(response: CopyTo, encoder: CopyEncoder, inner: Subscribing) -> AsyncIterator[bytes]:
    try:
        header = encoder.header()
        if header:
            yield header
        async for batch in inner.batches:
            for row in batch:
                response.row_count += 1
                yield encoder.row(row)
        trailer = encoder.trailer()
        if trailer:
            yield trailer
    finally:
        inner.cancel()
