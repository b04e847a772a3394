"""Run PostgreSQL's regression files on both servers, statement by statement, and score headrace.

Per file, one session per server (`Servers.settings`: pg_regress's by default); each statement runs on PostgreSQL, then on
headrace, with a deadline, and the outcomes are compared (`compare.py`). Before the files, `test_setup.sql` (the tables
onek, tenk1, int4_tbl, ... most files read) runs on both; where headrace refuses a CREATE TABLE only for the column
type `name`, it is created with `text` instead (same text output), and the report lists this and every other set-up
statement headrace could not run."""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.compat.compare import DIFFERS, ERROR_DIFFERS, ERROR_SAME, HR_ERROR, HR_TIMEOUT, SAME, Verdict, compare
from tests.compat.servers import Servers
from tests.compat.session import Outcome, Session
from tests.compat.splitter import Kind, Statement, has_top_level_order_by, split

DEFAULT_TIMEOUT_S = 30.0
_WARM_UP_TIMEOUT_S = 180.0  # the first read of a table waits for Spark's start and first micro-batch
_SQL_SHOWN = 400
_CREATED_TABLE = re.compile(r"^CREATE TABLE\s+(\w+)", re.IGNORECASE)
_SETUP_TARGET = re.compile(r"^(?:CREATE TABLE|INSERT INTO|COPY|VACUUM(?: ANALYZE)?)\s+(\w+)", re.IGNORECASE)
_NAME_TYPE = re.compile(r"\bname\b(?=\s*[,)])", re.IGNORECASE)


@dataclass
class FileScore:
    name: str
    statements: list[dict[str, Any]] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    select_counts: Counter[str] = field(default_factory=Counter)
    skipped: int = 0
    seconds: float = 0.0
    reconnects: dict[str, int] = field(default_factory=dict)

    @property
    def pg_ok(self) -> int:
        return sum(self.counts[v] for v in (SAME, DIFFERS, HR_ERROR, HR_TIMEOUT))

    @property
    def select_pg_ok(self) -> int:
        return sum(self.select_counts[v] for v in (SAME, DIFFERS, HR_ERROR, HR_TIMEOUT))

    @property
    def score(self) -> float:
        return self.counts[SAME] / self.pg_ok if self.pg_ok else 1.0

    @property
    def select_score(self) -> float:
        return self.select_counts[SAME] / self.select_pg_ok if self.select_pg_ok else 1.0

    def summary(self) -> dict[str, Any]:
        return {"pg_ok": self.pg_ok, "same": self.counts[SAME], "score": round(self.score, 4),
                "select_pg_ok": self.select_pg_ok, "select_same": self.select_counts[SAME],
                "select_score": round(self.select_score, 4), "verdicts": dict(self.counts),
                "skipped": self.skipped, "seconds": round(self.seconds, 1), "reconnects": self.reconnects}


def _copy_bytes(statement: Statement, regress: Path) -> bytes | None:
    if statement.copy_file is not None:
        return (regress / statement.copy_file).read_bytes()
    if statement.copy_data is not None:
        return statement.copy_data.encode()
    return None


def _record(statement: Statement, pg: Outcome, hr: Outcome, verdict: Verdict, ordered: bool) -> dict[str, Any]:
    record: dict[str, Any] = {"line": statement.line, "sql": statement.sql[:_SQL_SHOWN], "select": statement.is_select,
                              "ordered": ordered, "verdict": verdict.verdict, "pg_ms": round(pg.seconds * 1000, 1),
                              "hr_ms": round(hr.seconds * 1000, 1)}
    if verdict.diff:
        record["diff"] = verdict.diff
    if pg.status == "error":
        record["pg_sqlstate"] = pg.sqlstate
    if hr.status == "error":
        record["hr_sqlstate"] = hr.sqlstate
    return record


def run_statements(name: str, statements: list[Statement], servers: Servers, regress: Path,
                   timeout: float = DEFAULT_TIMEOUT_S) -> FileScore:
    score = FileScore(name)
    started = time.monotonic()
    pg = Session(servers.postgres_dsn, servers.settings)
    hr = Session(servers.headrace_dsn, servers.settings)
    try:
        for statement in statements:
            if statement.kind is Kind.SKIPPED:
                score.skipped += 1
                score.statements.append({"line": statement.line, "sql": statement.sql[:_SQL_SHOWN],
                                         "verdict": "skipped", "reason": statement.reason})
                continue
            data = _copy_bytes(statement, regress)
            pg_outcome = pg.run(statement.sql, timeout, data)
            hr_outcome = hr.run(statement.sql, timeout, data)
            ordered = has_top_level_order_by(statement.sql)
            verdict = compare(pg_outcome, hr_outcome, ordered)
            score.counts[verdict.verdict] += 1
            if statement.is_select:
                score.select_counts[verdict.verdict] += 1
            score.statements.append(_record(statement, pg_outcome, hr_outcome, verdict, ordered))
    finally:
        score.reconnects = {"postgres": pg.reconnects, "headrace": hr.reconnects}
        score.seconds = time.monotonic() - started
        pg.close()
        hr.close()
    return score


def run_file(name: str, servers: Servers, regress: Path, timeout: float = DEFAULT_TIMEOUT_S) -> FileScore:
    statements = split((regress / "sql" / f"{name}.sql").read_text())
    return run_statements(name, statements, servers, regress, timeout)


def setup(servers: Servers, regress: Path, timeout: float = 60.0,
          tables: frozenset[str] | None = None) -> list[dict[str, Any]]:
    """Run test_setup.sql on both servers (only the statements on `tables`, lower case, if given); return what
    headrace could not set up (and how it was helped)."""
    problems: list[dict[str, Any]] = []
    created: list[str] = []
    pg = Session(servers.postgres_dsn, servers.settings)
    hr = Session(servers.headrace_dsn, servers.settings)
    try:
        for sql, outcome in hr.setup_outcomes:
            if outcome.status != "ok":
                problems.append({"sql": sql, "headrace": f"{outcome.sqlstate} {outcome.message}", "session": True})
        for statement in split((regress / "sql" / "test_setup.sql").read_text()):
            if statement.kind is Kind.SKIPPED or (tables is not None and _target(statement.sql) not in tables):
                continue
            data = _copy_bytes(statement, regress)
            pg_outcome = pg.run(statement.sql, timeout, data)
            if pg_outcome.status != "ok":
                continue  # e.g. the C functions of regress.so, which this harness does not build
            hr_outcome = hr.run(statement.sql, timeout, data)
            table = _CREATED_TABLE.match(statement.sql)
            if table:
                created.append(table.group(1))
            if hr_outcome.status == "ok":
                continue
            problem = {"line": statement.line, "sql": statement.sql[:_SQL_SHOWN],
                       "headrace": f"{hr_outcome.sqlstate} {hr_outcome.message}"[:300]}
            if statement.sql.upper().startswith("CREATE TABLE") and _NAME_TYPE.search(statement.sql):
                retried = hr.run(_NAME_TYPE.sub("text", statement.sql), timeout, data)
                problem["fallback"] = "column type name created as text" + (
                    "" if retried.status == "ok" else f", still refused: {retried.sqlstate} {retried.message}"[:300])
            problems.append(problem)
        problems.extend(_warm_up(pg, hr, created))
    finally:
        pg.close()
        hr.close()
    return problems


def _target(sql: str) -> str:
    """The relation a set-up statement writes (CREATE TABLE, INSERT INTO, COPY, VACUUM), lower case, or ''."""
    match = _SETUP_TARGET.match(sql)
    return match.group(1).lower() if match else ""


def _warm_up(pg: Session, hr: Session, tables: list[str]) -> list[dict[str, Any]]:
    """Read every set-up table once on both, so the files' first reads do not pay the pipeline's start; return the
    tables whose row count differs (or that headrace cannot read)."""
    problems: list[dict[str, Any]] = []
    for table in tables:
        sql = f"SELECT count(*) FROM {table}"
        pg_outcome = pg.run(sql, _WARM_UP_TIMEOUT_S)
        deadline = time.monotonic() + _WARM_UP_TIMEOUT_S
        hr_outcome = hr.run(sql, _WARM_UP_TIMEOUT_S)
        # headrace gives up waiting for the pipeline after 60 s (57P03); a cold Spark on a busy machine takes longer
        while hr_outcome.sqlstate == "57P03" and time.monotonic() < deadline:
            hr_outcome = hr.run(sql, _WARM_UP_TIMEOUT_S)
        if pg_outcome.status != "ok":
            continue
        if hr_outcome.status != "ok" or hr_outcome.rows != pg_outcome.rows:
            problems.append({"sql": sql, "postgres": pg_outcome.rows, "headrace": hr_outcome.rows if
                             hr_outcome.status == "ok" else f"{hr_outcome.sqlstate} {hr_outcome.message}"[:300]})
    return problems
