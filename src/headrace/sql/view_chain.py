"""Views over views: the upstream view's rows as a change stream for the view reading it.

A view over a view is one more binding of the root source's materialization (pipeline/view_changes.py). In each
transaction the runtime reduces the upstream view's documents and hands, per changed key, the stored document
before and after (materialize/runtime.py DerivedBinding); `row_changes` turns them into the change-stream rows of
pipeline/views.py: -1 for the old public row, +1 for the new one (nothing when the row did not change), keyed by
the upstream's `hr_key`.

The public row is read straight from the stored document, so the upstream view must store its public columns as
they are shown: every output of an aggregating view a group key or an aggregate as such (no expression over
them), no HAVING, no array-typed output (stored as JSON, shown as T[]), and a GROUP BY (a global aggregate shows
a row even when nothing is stored). `chain_refusal` says why a view cannot be read by another view, or None."""

from __future__ import annotations

from typing import Any

import orjson
from sqlglot import exp

from headrace.sql import view_numeric
from headrace.sql.views import KEY_FIELD, ViewPlan

Document = dict[str, Any]


def chain_refusal(plan: ViewPlan) -> str | None:
    """Why another view cannot read the view `plan` (None: it can)."""
    if plan.having is not None:
        return "it has a HAVING clause"
    if plan.aggregating and not plan.group_keys:
        return "it is a global aggregate (no GROUP BY)"
    for output in plan.outputs:
        if output.pg_type.endswith("[]"):
            return f"its column {output.name} is an array"
        if plan.aggregating and not isinstance(output.expression, exp.Column):
            return f"its column {output.name} is an expression over aggregates or keys"
    return None


def stored_fields(plan: ViewPlan) -> list[tuple[str, str, str]]:
    """(public column, stored field, PostgreSQL type) of each output of a chainable view."""
    if plan.aggregating:
        return [(o.name, o.expression.name, o.pg_type) for o in plan.outputs]
    return [(o.name, f"o{i}", o.pg_type) for i, o in enumerate(plan.outputs)]


def _public_row(fields: list[tuple[str, str, str]], doc: Document | None) -> dict[str, Any] | None:
    if doc is None:
        return None
    meta = doc.get("_meta")
    if isinstance(meta, dict) and meta.get("op") == "d":
        return None
    row: dict[str, Any] = {}
    for name, field, pg_type in fields:
        value = doc.get(field)
        if pg_type in ("jsonb", "json") and value is not None:
            value = orjson.dumps(value).decode()  # the change stream carries jsonb as JSON text
        elif pg_type == "numeric":
            value = view_numeric.read(value)  # stored as numeric text, computed on as a double (sql/view_numeric.py)
        row[name] = value
    return row


def row_changes(plan: ViewPlan, changes: list[tuple[Document | None, Document | None]],
                first_seq: int) -> list[dict[str, Any]]:
    """Change-stream rows (public columns + hr_diff, hr_seq, hr_row, hr_at) for one transaction of the upstream
    view `plan`; sequence numbers start at `first_seq`, a -1 and its +1 share one (the -1 sorts first)."""
    fields = stored_fields(plan)
    rows: list[dict[str, Any]] = []
    seq = first_seq
    for old, new in changes:
        old_row, new_row = _public_row(fields, old), _public_row(fields, new)
        if old_row == new_row:
            continue
        key = (new if new_row is not None else old) or {}
        row_id = orjson.dumps([key.get(KEY_FIELD)]).decode()
        if old_row is not None:
            rows.append({**old_row, "hr_diff": -1, "hr_seq": seq, "hr_row": row_id, "hr_at": seq})
        if new_row is not None:
            rows.append({**new_row, "hr_diff": 1, "hr_seq": seq, "hr_row": row_id, "hr_at": seq})
        seq += 1
    return rows
