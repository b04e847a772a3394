"""The score table printed by `make compat` and the JSON report (.compat-cache/report.json) later sessions mine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.compat.compare import DIFFERS, ERROR_DIFFERS, ERROR_SAME, HR_ERROR, HR_TIMEOUT, SAME
from tests.compat.regress import FileScore


def totals(scores: list[FileScore]) -> dict[str, Any]:
    pg_ok = sum(s.pg_ok for s in scores)
    same = sum(s.counts[SAME] for s in scores)
    select_pg_ok = sum(s.select_pg_ok for s in scores)
    select_same = sum(s.select_counts[SAME] for s in scores)
    statements = sum(sum(s.counts.values()) for s in scores)
    return {"files": len(scores), "statements": statements, "pg_ok": pg_ok, "same": same,
            "score": round(same / pg_ok, 4) if pg_ok else 1.0, "select_pg_ok": select_pg_ok,
            "select_same": select_same, "select_score": round(select_same / select_pg_ok, 4) if select_pg_ok else 1.0,
            "pg_errors": sum(s.counts[ERROR_SAME] + s.counts[ERROR_DIFFERS] for s in scores),
            "error_sqlstate_same": sum(s.counts[ERROR_SAME] for s in scores),
            "skipped": sum(s.skipped for s in scores)}


def table(scores: list[FileScore]) -> str:
    header = (f"{'file':<16} {'stmts':>6} {'pg ok':>6} {'same':>6} {'score':>7} {'sel ok':>7} {'sel same':>8} "
              f"{'sel %':>7} {'differs':>7} {'hr err':>6} {'timeout':>7} {'err=':>5} {'err!=':>5} {'skip':>4} {'s':>6}")
    lines = [header, "-" * len(header)]
    for s in scores:
        lines.append(f"{s.name:<16} {sum(s.counts.values()):>6} {s.pg_ok:>6} {s.counts[SAME]:>6} {s.score:>7.1%} "
                     f"{s.select_pg_ok:>7} {s.select_counts[SAME]:>8} {s.select_score:>7.1%} {s.counts[DIFFERS]:>7} "
                     f"{s.counts[HR_ERROR]:>6} {s.counts[HR_TIMEOUT]:>7} {s.counts[ERROR_SAME]:>5} "
                     f"{s.counts[ERROR_DIFFERS]:>5} {s.skipped:>4} {s.seconds:>6.0f}")
    overall = totals(scores)
    lines.append("-" * len(header))
    lines.append(f"overall: {overall['same']}/{overall['pg_ok']} = {overall['score']:.1%} of the statements PostgreSQL "
                 f"runs successfully; SELECTs {overall['select_same']}/{overall['select_pg_ok']} = "
                 f"{overall['select_score']:.1%}; errors with PostgreSQL's SQLSTATE "
                 f"{overall['error_sqlstate_same']}/{overall['pg_errors']}; {overall['statements']} statements run, "
                 f"{overall['skipped']} psql meta-commands skipped")
    return "\n".join(lines)


def write_report(path: Path, scores: list[FileScore], setup_problems: list[dict[str, Any]],
                 extra: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {"totals": totals(scores), **extra, "setup_problems": setup_problems,
              "files": {s.name: {**s.summary(), "statements": s.statements} for s in scores}}
    path.write_text(json.dumps(report, indent=1))
