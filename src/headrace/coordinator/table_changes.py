"""Row changes of INSERT / UPDATE / DELETE, computed against a table's current contents (pure: no I/O).

`PendingTable` is one transaction's changes to one table: per key the row before the transaction's first
change (`base`) and the row now (`current`); its net changes become one log record at COMMIT. The functions
check what PostgreSQL checks: NOT NULL (23502) and the primary key (23505, also between rows of one
statement), given which keys exist now (the caller looks them up: serving store + unapplied log + this
transaction)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from headrace.catalog.tables import Table, TableColumn
from headrace.errors import HeadraceError
from headrace.store import table_types
from headrace.store.table_log import Document, RowChange, change_between

Key = tuple[Any, ...]
NOT_NULL_VIOLATION = "23502"
UNIQUE_VIOLATION = "23505"
SERIALIZATION_FAILURE = "40001"


def row_key(table: Table, document: Document) -> Key:
    return tuple(document.get(column) for column in table.store_key)


def check_not_null(table: Table, document: Document) -> None:
    for column in table.not_null_columns:
        if document.get(column) is None:
            shown = ", ".join("null" if document.get(c.name) is None else _column_text(c, document.get(c.name))
                              for c in table.columns)
            raise HeadraceError(f'null value in column "{column}" of relation "{table.name}" violates not-null '
                                "constraint", detail=f"Failing row contains ({shown}).", sqlstate=NOT_NULL_VIOLATION)


def duplicate_key(table: Table, key: Key) -> HeadraceError:
    columns = ", ".join(table.store_key)
    values = ", ".join(_text(value) for value in key)
    return HeadraceError(f'duplicate key value violates unique constraint "{table.name}_pkey"',
                         detail=f"Key ({columns})=({values}) already exists.", sqlstate=UNIQUE_VIOLATION)


def _column_text(column: TableColumn, value: Any) -> str:
    """A document value as PostgreSQL prints it in a failing row (dates, timestamps, ... not their numbers)."""
    if column.pg_type in ("date", "timestamp", "timestamptz") and isinstance(value, int):
        return table_types.date_text(value) if column.pg_type == "date" else \
            table_types.time_text(value, with_zone=column.pg_type == "timestamptz")
    if column.pg_type in table_types.EXACT_TYPES:
        value = table_types.to_python(column.pg_type, value)
    return _text(value)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "t" if value else "f"
    return str(value)


@dataclass
class PendingTable:
    """One transaction's changes to one table, net per key, in first-change order."""

    table: Table
    base: dict[Key, Document | None] = field(default_factory=dict)
    current: dict[Key, Document | None] = field(default_factory=dict)

    def set(self, key: Key, before: Document | None, after: Document | None) -> None:
        """Row `key` goes from `before` (its contents as the statement saw them) to `after` (None: deleted)."""
        if key not in self.base:
            self.base[key] = before
        self.current[key] = after

    def changes(self) -> list[RowChange]:
        found = (change_between(key, self.base[key], self.current[key]) for key in self.current)
        return [change for change in found if change is not None]

    def __bool__(self) -> bool:
        return bool(self.current)


def insert(pending: PendingTable, documents: Iterable[Document], existing: Mapping[Key, Document | None]) -> int:
    """Insert rows: `existing` maps each inserted key to its current row (None or absent: no such row), this
    transaction's own changes already applied. All rows are checked before any is applied."""
    table = pending.table
    staged: dict[Key, Document] = {}
    for document in documents:
        check_not_null(table, document)
        key = row_key(table, document)
        if key in staged or existing.get(key) is not None:
            raise duplicate_key(table, key)
        staged[key] = document
    for key, document in staged.items():
        pending.set(key, None, document)
    return len(staged)


def update(pending: PendingTable, pairs: list[tuple[Document, Document]],
           existing: Mapping[Key, Document | None]) -> int:
    """Rows go from old to new. A changed key moves the row: its old key is deleted, and the new key must be
    free (in `existing`, which maps every new key to its current row) unless this statement vacates it."""
    table = pending.table
    vacated = {row_key(table, old) for old, new in pairs if row_key(table, old) != row_key(table, new)}
    staged: dict[Key, tuple[Document, Document]] = {}
    for old, new in pairs:
        check_not_null(table, new)
        old_key, new_key = row_key(table, old), row_key(table, new)
        if new_key in staged:
            raise duplicate_key(table, new_key)
        if new_key != old_key and new_key not in vacated and existing.get(new_key) is not None:
            raise duplicate_key(table, new_key)
        staged[new_key] = (old, new)
    for old, new in pairs:  # deletions of moved rows first: a later row may move into a vacated key
        old_key = row_key(table, old)
        if old_key != row_key(table, new) and old_key not in staged:
            pending.set(old_key, old, None)
    for new_key, (old, new) in staged.items():
        before = old if row_key(table, old) == new_key else _current_of(pending, new_key, existing)
        pending.set(new_key, before, new)
    return len(pairs)


def _current_of(pending: PendingTable, key: Key, existing: Mapping[Key, Document | None]) -> Document | None:
    if key in pending.current:
        return pending.current[key]
    return existing.get(key)


def delete(pending: PendingTable, rows: list[Document]) -> int:
    table = pending.table
    for old in rows:
        pending.set(row_key(table, old), old, None)
    return len(rows)


def conflicts(pending: PendingTable, committed: Mapping[Key, Document | None],
              keys: Iterable[Key] | None = None) -> list[Key]:
    """Keys (of `keys`, default all this transaction changed) whose committed row changed since this
    transaction read it (first committer wins: 40001)."""
    return [key for key in (pending.base if keys is None else keys) if committed.get(key) != pending.base[key]]


def serialization_failure(table: Table) -> HeadraceError:
    return HeadraceError("could not serialize access due to concurrent update",
                         detail=f'another transaction changed rows of "{table.name}" this transaction changed',
                         hint="retry the transaction", sqlstate=SERIALIZATION_FAILURE)
