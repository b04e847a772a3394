"""The committed baseline (tests/compat/baseline.json): each regression file's score and the view cases' score from
the last recorded `make compat`. The ratchet test fails when a score falls below it; `python -m tests.compat
--update-baseline` records a new one (after a change that raises scores)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.compat.regress import FileScore

BASELINE = Path(__file__).with_name("baseline.json")
VIEWS = "views"


def load(path: Path = BASELINE) -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = json.loads(path.read_text())["scores"]
    return data


def record(scores: list[FileScore], view_same: int, view_checks: int, path: Path = BASELINE) -> None:
    entries: dict[str, dict[str, Any]] = {
        s.name: {"same": s.counts["same"], "pg_ok": s.pg_ok, "score": round(s.score, 4)} for s in scores}
    if view_checks:
        entries[VIEWS] = {"same": view_same, "pg_ok": view_checks, "score": round(view_same / view_checks, 4)}
    previous = load(path) if path.exists() else {}
    path.write_text(json.dumps({"scores": {**previous, **entries}}, indent=1, sort_keys=True) + "\n")


def regressions(name: str, same: int, pg_ok: int, baseline: dict[str, dict[str, Any]]) -> str | None:
    """A message when `name` scores below its baseline (score as a fraction, so a corpus change in PostgreSQL's
    successes is compared fairly), else None."""
    recorded = baseline.get(name)
    if recorded is None:
        return f"{name}: no baseline recorded (python -m tests.compat --update-baseline)"
    score = same / pg_ok if pg_ok else 1.0
    if same * recorded["pg_ok"] < recorded["same"] * pg_ok:  # same/pg_ok < recorded same/pg_ok, exactly
        return f"{name}: {same}/{pg_ok} = {score:.4f} < baseline {recorded['same']}/{recorded['pg_ok']} = {recorded['score']}"
    return None
