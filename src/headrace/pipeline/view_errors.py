"""Errors are data: a change whose view expression fails is set aside as an error of that view, not a failed batch.

Spark evaluates a view's expressions under ANSI rules, so a row whose value cannot be computed (an integer cast out
of range, a division by zero, text that is no number) raises and fails the whole micro-batch; retried, it failed
forever and stalled the source and every view on it (issue 22). As Materialize keeps an error collection beside each
view's rows, a view here keeps one error per failing input row:

  1. the batch's views are computed as always (no cost while nothing fails);
  2. when the computation raises a data error (Spark SQLSTATE class 22), the batch's changes are collected as Arrow and,
     per view, the failing changes are found by bisection (`isolate`: a part that evaluates holds none; about 2 log2 n
     Spark jobs per failing change) and left out; the view's documents are computed from the rest;
  3. per input row (`hr_row`: a source's log offset, a table's primary key) with a failing change, the row's error
     state after the batch is its LAST change's: a +1 that fails sets the error (PostgreSQL's SQLSTATE and message,
     `pg_error`), a -1 or a +1 that evaluates clears it. The entries ride in the transaction's runtime checkpoint
     (`ERRORS_FIELD`); the serving driver applies them in the same store transaction as the view's rows
     (store/view_errors.py), so a kill -9 neither loses nor doubles one, and a replayed entry changes nothing (it is
     a state, not a delta).

Retraction is exact because evaluation is deterministic: a row version that failed on its +1 fails again on its -1,
so it never counted in the view and is never subtracted; deleting or updating the row clears its error. A failure that
no single change causes (an aggregate overflowing over several rows) still fails the batch, as before."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from headrace.store.view_errors import ERRORS_FIELD

log = logging.getLogger(__name__)
T = TypeVar("T")
ErrorEntry = list[Any]  # [view id, row key, sqlstate | None, message | None]: None clears the row's error

# Spark's type names (error message parameters) -> PostgreSQL's, as its messages spell them.
_PG_TYPE_NAMES = {"INT": "integer", "BIGINT": "bigint", "SMALLINT": "smallint", "TINYINT": "smallint",
                  "DOUBLE": "double precision", "FLOAT": "real", "BOOLEAN": "boolean", "DATE": "date",
                  "TIMESTAMP": "timestamp with time zone", "TIMESTAMP_NTZ": "timestamp without time zone"}
_OVERFLOW_TYPES = {"integer overflow": "integer", "long overflow": "bigint", "short overflow": "smallint"}
_INTEGER_TEXT = re.compile(r"^\s*[+-]?\d+\s*$")


def _pg_type(spark_type: str) -> str:
    name = spark_type.strip().strip('"')
    return "numeric" if name.startswith("DECIMAL") else _PG_TYPE_NAMES.get(name, name.lower())


def _spark_literal(expression: str) -> str:
    """The value of a Spark SQL string literal as an error message quotes it ('it''s' or 'it\\'s')."""
    text = expression.strip()
    if len(text) >= 2 and text[0] == text[-1] == "'":
        text = text[1:-1].replace("\\'", "'").replace("''", "'")
    return text


def pg_error(exc: BaseException) -> tuple[str, str] | None:
    """PostgreSQL's (SQLSTATE, message) for a Spark error that a row's value raised, or None when `exc` is not a data
    error (class 22): those still fail the batch, to be retried."""
    get_state = getattr(exc, "getSqlState", None)
    get_condition = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    if get_state is None or get_condition is None:
        return None
    try:
        sqlstate, condition = get_state() or "", (get_condition() or "").split(".")[0]
        parameters: dict[str, str] = exc.getMessageParameters() or {}  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a JVM gone away: not a row's error
        return None
    if not sqlstate.startswith("22"):
        return None
    if condition in ("DIVIDE_BY_ZERO", "REMAINDER_BY_ZERO", "INTERVAL_DIVIDED_BY_ZERO"):
        return "22012", "division by zero"
    if condition in ("CAST_OVERFLOW", "CAST_OVERFLOW_IN_TABLE_INSERT"):
        target = _pg_type(parameters.get("targetType", ""))
        return "22003", f"{target} out of range" if target in ("integer", "bigint", "smallint") else \
            "value out of range: overflow"
    if condition == "ARITHMETIC_OVERFLOW":
        kind = _OVERFLOW_TYPES.get(parameters.get("message", "").strip())
        return "22003", f"{kind} out of range" if kind else "value out of range: overflow"
    if condition == "NUMERIC_VALUE_OUT_OF_RANGE":
        return "22003", "value overflows numeric format"
    if condition == "CAST_INVALID_INPUT":
        target = _pg_type(parameters.get("targetType", ""))
        value = _spark_literal(parameters.get("expression", ""))
        if target in ("integer", "bigint", "smallint") and _INTEGER_TEXT.match(value):
            return "22003", f'value "{value}" is out of range for type {target}'
        return "22P02", f'invalid input syntax for type {target}: "{value}"'
    message = str(exc).splitlines()[0] if str(exc) else condition
    return sqlstate, re.sub(r"^\[[A-Z_.]+\]\s*", "", message)[:500]


def isolate(evaluate: Callable[[pa.Table], T], changes: pa.Table) -> tuple[T, dict[int, tuple[str, str]]]:
    """`evaluate` over the changes it can evaluate, and the row index -> (sqlstate, message) of each change it cannot.

    Bisection: the whole first (the common case: one Spark job), then halves of a failing part until single changes
    remain. A data error no single change causes is re-raised (the batch fails, as before)."""
    failing: dict[int, tuple[str, str]] = {}

    def bisect(start: int, length: int) -> None:
        try:
            evaluate(changes.slice(start, length))
        except Exception as exc:  # noqa: BLE001 - only data errors are kept; the rest re-raised
            error = pg_error(exc)
            if error is None:
                raise
            if length == 1:
                failing[start] = error
                return
            half = length // 2
            bisect(start, half)
            bisect(start + half, length - half)

    try:
        return evaluate(changes), failing
    except Exception as exc:  # noqa: BLE001
        if pg_error(exc) is None or changes.num_rows == 0:
            raise
    half = changes.num_rows // 2
    if changes.num_rows > 1:
        bisect(0, half)
        bisect(half, changes.num_rows - half)
    else:
        bisect(0, 1)
    if not failing:
        raise RuntimeError("a view's data error that no single change causes (an aggregate's overflow?)")
    kept = changes.filter(pc.invert(pc.is_in(pa.array(range(changes.num_rows), pa.int64()),
                                             value_set=pa.array(sorted(failing), pa.int64()))))
    return evaluate(kept), failing


def error_entries(view_id: str, changes: pa.Table, failing: dict[int, tuple[str, str]]) -> list[ErrorEntry]:
    """Each input row with a failing change -> its error state after the batch: its last change (by hr_seq, the -1 of
    a replacement first) decides (module docstring)."""
    if not failing:
        return []
    rows, seqs, diffs = (changes[name].to_pylist() for name in ("hr_row", "hr_seq", "hr_diff"))
    touched = {rows[index] for index in failing}
    last: dict[str, int] = {}
    for index in sorted(range(len(rows)), key=lambda i: (seqs[i], diffs[i])):
        if rows[index] in touched:
            last[rows[index]] = index
    entries: list[ErrorEntry] = []
    for row, index in sorted(last.items()):
        error = failing.get(index) if diffs[index] > 0 else None
        entries.append([view_id, row, *(error if error is not None else (None, None))])
    return entries


def documents_isolating_errors(views: Sequence[Any], changes: pa.Table,
                               compute: Callable[[Any, pa.Table], list[T]]) -> tuple[list[T], list[ErrorEntry]]:
    """Per view (a SourceView), `compute(view, changes)` over the changes it can evaluate, and the error entries of the
    ones it cannot (module docstring)."""
    results: list[T] = []
    entries: list[ErrorEntry] = []
    for view in views:
        documents, failing = isolate(lambda part, view=view: compute(view, part), changes)
        if failing:
            log.warning("materialized view %s: %d change(s) fail to evaluate (first: %s); kept as errors of the view",
                        view.view.name, len(failing), next(iter(failing.values()))[1])
        results.extend(documents)
        entries.extend(error_entries(view.view.id, changes, failing))
    return results, entries


def is_data_error(exc: BaseException) -> bool:
    return pg_error(exc) is not None


class DocumentsWithErrors(list):  # type: ignore[type-arg]
    """Documents for Runtime.transact that carry fields for the checkpoint they commit with (`checkpoint_fields`):
    a backfill's errors, whose checkpoint pipeline/process.py builds."""

    def __init__(self, documents: Sequence[Any] = (), errors: Sequence[ErrorEntry] = ()) -> None:
        super().__init__(documents)
        self.checkpoint_fields: dict[str, Any] = {ERRORS_FIELD: list(errors)} if errors else {}
