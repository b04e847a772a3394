"""What a transaction block did to tables, for ROLLBACK and ROLLBACK TO SAVEPOINT, as PostgreSQL undoes it.

A block's writes stay in the session until COMMIT (coordinator/tables.py, per table a `PendingTable`); a table the
block created exists at once (its catalog entry, log and store relations: headrace's DDL is not PostgreSQL's), so
the block remembers it and a ROLLBACK drops it again, with what was made over it since (CASCADE: only the block
can have made that). A SAVEPOINT takes a copy of both; ROLLBACK TO puts the writes back as they were and drops the
tables created after it. Not undone: DROP TABLE (its log is gone), headrace's other DDL."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from headrace.coordinator import table_changes as changes

PENDING_ATTRIBUTE = "_table_writes"
_CREATED_ATTRIBUTE = "_tables_created"


@dataclass(frozen=True, slots=True)
class WritesSnapshot:
    """A block's table writes and created tables at a SAVEPOINT."""

    pending: dict[str, tuple[dict[Any, Any], dict[Any, Any]]]  # table id -> (base, current)
    created: int  # how many tables the block had created


def pending_writes(session: Any) -> dict[str, changes.PendingTable]:
    """The block's writes per table id (made on first use)."""
    pending: dict[str, changes.PendingTable] | None = getattr(session, PENDING_ATTRIBUTE, None)
    if pending is None:
        pending = {}
        setattr(session, PENDING_ATTRIBUTE, pending)
    return pending


def note_created(session: Any, table_id: str) -> None:
    created: list[str] | None = getattr(session, _CREATED_ATTRIBUTE, None)
    if created is None:
        created = []
        setattr(session, _CREATED_ATTRIBUTE, created)
    created.append(table_id)


def created_any(session: Any) -> bool:
    return bool(getattr(session, _CREATED_ATTRIBUTE, None))


def take_created(session: Any, keep: int = 0) -> list[str]:
    """The tables created after the first `keep`, newest first; forgotten by the block."""
    created: list[str] = getattr(session, _CREATED_ATTRIBUTE, None) or []
    taken = created[keep:]
    del created[keep:]
    return list(reversed(taken))


def snapshot(session: Any) -> WritesSnapshot:
    # documents are copied whole: a later statement's change must not reach the savepoint's copy
    pending = {table_id: (copy.deepcopy(part.base), copy.deepcopy(part.current))
               for table_id, part in pending_writes(session).items()}
    return WritesSnapshot(pending, len(getattr(session, _CREATED_ATTRIBUTE, None) or []))


def restore(session: Any, saved: WritesSnapshot) -> list[str]:
    """The writes as at the savepoint; returns the ids of the tables created after it (to drop), newest first."""
    pending = pending_writes(session)
    for table_id in list(pending):
        if table_id not in saved.pending:
            del pending[table_id]
    for table_id, (base, current) in saved.pending.items():
        part = pending.get(table_id)
        if part is not None:
            part.base, part.current = copy.deepcopy(base), copy.deepcopy(current)
    return take_created(session, saved.created)
