"""Compare headrace's outcome of a statement with PostgreSQL's: column names, command tag, rows as text (in order
when the statement has a top-level ORDER BY, else as multisets) and, when PostgreSQL fails, the SQLSTATE."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tests.compat.session import Outcome

# Verdicts. SAME and DIFFERS are over statements PostgreSQL ran successfully (the score's denominator).
SAME = "same"
DIFFERS = "differs"  # headrace answered, with other columns, rows or tag
HR_ERROR = "hr_error"  # headrace failed where PostgreSQL did not
HR_TIMEOUT = "hr_timeout"  # headrace did not answer in time (or lost the session)
ERROR_SAME = "error_same"  # both failed with the same SQLSTATE
ERROR_DIFFERS = "error_differs"  # PostgreSQL failed; headrace succeeded or failed with another SQLSTATE
PG_UNUSABLE = "pg_unusable"  # PostgreSQL itself timed out or lost its session: not counted

_SHOWN_ROWS = 3


@dataclass(frozen=True)
class Verdict:
    verdict: str
    diff: str = ""

    @property
    def pg_succeeded(self) -> bool:
        return self.verdict in (SAME, DIFFERS, HR_ERROR, HR_TIMEOUT)


def _short(value: object, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _rows_diff(pg_rows: list[tuple[str | None, ...]], hr_rows: list[tuple[str | None, ...]], ordered: bool) -> str:
    if ordered:
        for index, (pg_row, hr_row) in enumerate(zip(pg_rows, hr_rows)):
            if pg_row != hr_row:
                return f"row {index}: pg {_short(pg_row)} hr {_short(hr_row)}"
        return f"rows: pg {len(pg_rows)}, hr {len(hr_rows)}"
    pg_count, hr_count = Counter(pg_rows), Counter(hr_rows)
    only_pg = list((pg_count - hr_count).elements())[:_SHOWN_ROWS]
    only_hr = list((hr_count - pg_count).elements())[:_SHOWN_ROWS]
    return f"rows (unordered, pg {len(pg_rows)}, hr {len(hr_rows)}): only pg {_short(only_pg)} only hr {_short(only_hr)}"


def compare(pg: Outcome, hr: Outcome, ordered: bool) -> Verdict:
    if pg.status in ("timeout", "lost"):
        return Verdict(PG_UNUSABLE, f"postgres {pg.status}: {pg.message}")
    if pg.status == "error":
        if hr.status == "error" and hr.sqlstate == pg.sqlstate:
            return Verdict(ERROR_SAME)
        got = f"{hr.sqlstate} {hr.message}" if hr.status == "error" else hr.status
        return Verdict(ERROR_DIFFERS, f"pg {pg.sqlstate} {pg.message!r}; hr {_short(got, 200)}")
    if hr.status in ("timeout", "lost"):
        return Verdict(HR_TIMEOUT, hr.message)
    if hr.status == "error":
        return Verdict(HR_ERROR, f"hr {hr.sqlstate} {_short(hr.message, 200)}")
    if pg.columns != hr.columns:
        return Verdict(DIFFERS, f"columns: pg {_short(pg.columns)} hr {_short(hr.columns)}")
    rows_equal = pg.rows == hr.rows if ordered else Counter(pg.rows) == Counter(hr.rows)
    if not rows_equal:
        return Verdict(DIFFERS, _rows_diff(pg.rows, hr.rows, ordered))
    if pg.tag != hr.tag:
        return Verdict(DIFFERS, f"tag: pg {pg.tag!r} hr {hr.tag!r}")
    return Verdict(SAME)
