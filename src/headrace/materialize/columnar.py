"""Columnar documents of a binding: a transaction's combined documents as one Arrow table, reduced as columns.

For bindings whose reduction is column arithmetic (a view whose aggregates are all counts, sums and extremes), the
runtime need not build, send and reduce a Python document per key. The caller hands `Runtime.transact` a
`ColumnarDocuments`: its `partials` table holds one row per key (already combined: keys distinct), with the
binding's key columns; the runtime sends the keys as one LoadColumns, receives the stored rows as one LoadedColumns,
and calls `reduce(partials, loaded)`, which returns what to store as one StoreColumns (new rows, updated rows,
deleted keys): the same Load / Store steps of Flow's protocol, in columns. A binding fed this way must not also get
row documents in the same transaction, nor feed a derived binding (those need each key's old and new document)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa


@dataclass(frozen=True)
class ColumnarStores:
    """What one columnar reduction stores: `rows` for keys the store lacks, `updated` for keys it holds (both with
    the binding's key and value columns), `deleted` the key columns of keys to delete. None: nothing of that kind."""

    rows: pa.Table | None = None
    updated: pa.Table | None = None
    deleted: pa.Table | None = None


# (partials, the loaded rows of those keys the store holds in LoadedColumns' form, maybe none; None if the driver
# sent no LoadedColumns) -> what to store
ColumnarReduce = Callable[[pa.Table, pa.Table | None], ColumnarStores]


@dataclass(frozen=True)
class ColumnarDocuments:
    binding: int
    partials: pa.Table
    reduce: ColumnarReduce
