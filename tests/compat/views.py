"""headrace's own paths against PostgreSQL: each case's SELECT runs ad hoc over a headrace table (or webhook source)
and as a materialized view kept by Spark, after each phase of writes, and is compared with the same SELECT run by
PostgreSQL over a mirror of the same rows (a table with the same columns; for the source, a table of its `body`
jsonb, unique on the idempotency key). The writes are mirrored: INSERT, UPDATE, INSERT ... ON CONFLICT DO UPDATE
(replacement) and DELETE on the table; new bodies and replacements (same idempotency key) posted to the source.

A headrace read of a table (or of a view over it) waits for the pipeline (read-your-writes); a source has no such
wait, so its reads start once a sentinel view (count and sum of a write counter) equals PostgreSQL's."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.compat.compare import SAME, compare
from tests.compat.servers import Servers
from tests.compat.session import Outcome, Session

CASES_DIR = Path(__file__).with_name("cases")
TABLE = "compat_t"
SOURCE = "compat_src"
_TIMEOUT_S = 60.0
_SOURCE_WAIT_S = 120.0
_SENTINEL = "compat_src_sentinel"
_SENTINEL_SELECT = f"SELECT count(*) AS n, sum((body->>'seq')::int) AS s FROM {SOURCE}"


def load_cases(path: Path) -> list[tuple[str, str]]:
    """`-- name: <case>` headers, each followed by one SELECT (cases/*.sql)."""
    cases: list[tuple[str, str]] = []
    name = ""
    lines: list[str] = []
    for line in path.read_text().splitlines() + ["-- name: end"]:
        if line.startswith("-- name:"):
            if name:
                cases.append((name, "\n".join(lines).strip().rstrip(";")))
            name, lines = line.split(":", 1)[1].strip(), []
        elif not line.startswith("--"):
            lines.append(line)
    return cases


# -- the rows: deterministic, with NULLs, negative numbers, numeric scale, json documents and exact floats

def table_row(key: int, generation: int) -> str:
    a = None if key % 7 == 0 else (key * 13 + generation * 5) % 41 - 17
    b = (key * 1_000_003 + generation) * (-1 if key % 3 == 0 else 1)
    n = None if key % 11 == 0 else f"{(key * 37 + generation * 11) % 1000 - 400}.{(key * 7) % 1000:03d}"
    x = None if key % 5 == 0 else ((key * 3 + generation) % 17 - 8) * 0.25
    doc = {"k": f"k{(key + generation) % 3}", "v": (key * 5 + generation) % 9 - 4, "arr": [key, None, "s"],
           "o": {"p": None if key % 4 == 0 else f"p{key % 2}"}}
    flag = None if key % 6 == 0 else (key + generation) % 2 == 0

    def literal(value: object) -> str:
        if value is None:
            return "NULL"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str):
            return "'" + value.replace("'", "''") + "'"
        return str(value)
    values = [key, f"g{(key + generation) % 4}", a, b, n, x, json.dumps(doc), flag, None]
    return "(" + ", ".join(literal(v) for v in values[:-1]) + f", {generation})"


def source_body(key: int, generation: int, seq: int) -> dict[str, Any]:
    body: dict[str, Any] = {"id": f"e{key}", "g": f"g{(key + generation) % 3}", "seq": seq,
                            "n": f"{(key * 29 + generation * 7) % 500 - 200}.{(key * 3) % 100:02d}",
                            "o": {"p": f"p{(key + generation) % 2}"}}
    if key % 5 != 0:
        body["a"] = (key * 11 + generation * 3) % 37 - 12
    if key % 4 != 0:
        body["f"] = (key + generation) % 3 == 0
    return body


class ViewCases:
    def __init__(self, servers: Servers) -> None:
        self.servers = servers
        self.pg = Session(servers.postgres_dsn, servers.settings)
        self.hr = Session(servers.headrace_dsn, servers.settings)
        self.results: list[dict[str, Any]] = []
        self.seq = 0
        self.timings: dict[str, float] = {}  # seconds per phase, for the report
        self.table_cases: list[tuple[str, str]] = []
        self.source_cases: list[tuple[str, str]] = []

    def close(self) -> None:
        self.pg.close()
        self.hr.close()

    # -- set-up and writes, run on both servers

    def both(self, sql: str) -> tuple[Outcome, Outcome]:
        pg, hr = self.pg.run(sql, _TIMEOUT_S), self.hr.run(sql, _TIMEOUT_S)
        if pg.status != "ok":
            raise RuntimeError(f"PostgreSQL refused the harness's own statement {sql!r}: {pg.sqlstate} {pg.message}")
        if hr.status != "ok":
            self.results.append({"case": "write", "path": "table", "phase": "", "verdict": "hr_error",
                                 "diff": f"{sql[:200]}: {hr.sqlstate} {hr.message}"[:400]})
        return pg, hr

    def create(self) -> None:
        columns = ("id int PRIMARY KEY, g text, a int, b bigint, n numeric(12,3), x float8, j jsonb, f bool, "
                   "gen int")
        self.both(f"CREATE TABLE {TABLE} ({columns})")
        self.pg.run(f"CREATE TABLE {SOURCE} (body jsonb)", _TIMEOUT_S)
        self.pg.run(f"CREATE UNIQUE INDEX ON {SOURCE} ((body->>'id'))", _TIMEOUT_S)
        created = self.hr.run(f"CREATE SOURCE {SOURCE} FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id')",
                              _TIMEOUT_S)
        if created.status != "ok":
            raise RuntimeError(f"headrace refused CREATE SOURCE: {created.sqlstate} {created.message}")
        self.hr.run(f"CREATE MATERIALIZED VIEW {_SENTINEL} AS {_SENTINEL_SELECT}", _TIMEOUT_S)

    def post(self, bodies: list[dict[str, Any]]) -> None:
        url = self.servers.headrace.webhook_url(SOURCE)
        for body in bodies:
            data = json.dumps(body).encode()
            request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as response:
                if response.status != 200:
                    raise RuntimeError(f"webhook answered {response.status}")
            self.pg.run(f"INSERT INTO {SOURCE} VALUES ('{json.dumps(body).replace(chr(39), chr(39) * 2)}') "
                        f"ON CONFLICT ((body->>'id')) DO UPDATE SET body = EXCLUDED.body", _TIMEOUT_S)

    def next_bodies(self, keys: Iterator[int] | range, generation: int) -> list[dict[str, Any]]:
        bodies = []
        for key in keys:
            self.seq += 1
            bodies.append(source_body(key, generation, self.seq))
        return bodies

    def wait_for_source(self) -> bool:
        """Until headrace's sentinel view over the source equals PostgreSQL's answer (False on timeout)."""
        expected = self.pg.run(_SENTINEL_SELECT, _TIMEOUT_S).rows
        deadline = time.monotonic() + _SOURCE_WAIT_S
        while time.monotonic() < deadline:
            seen = self.hr.run(f"SELECT n, s FROM {_SENTINEL}", _TIMEOUT_S)
            if seen.status == "ok" and seen.rows == expected:
                return True
            time.sleep(0.5)
        return False

    # -- the comparisons

    def create_views(self, path: str, cases: list[tuple[str, str]]) -> None:
        for name, select in cases:
            created = self.hr.run(f"CREATE MATERIALIZED VIEW compat_v_{name} AS {select}", _TIMEOUT_S)
            if created.status != "ok":
                self.results.append({"case": name, "path": f"view over {path}", "phase": "create",
                                     "verdict": "refused", "diff": f"{created.sqlstate} {created.message}"[:300]})

    def check(self, path: str, phase: str, cases: list[tuple[str, str]], synced: bool = True) -> None:
        for name, select in cases:
            pg = self.pg.run(select, _TIMEOUT_S)
            ad_hoc = self.hr.run(select, _TIMEOUT_S)
            self._record(name, f"ad hoc over {path}", phase, pg, ad_hoc, synced)
            view = self.hr.run(f"SELECT * FROM compat_v_{name}", _TIMEOUT_S)
            if view.status == "error" and view.sqlstate == "42P01":
                continue  # refused at CREATE, recorded there
            self._record(name, f"view over {path}", phase, pg, view, synced)

    def _record(self, name: str, path: str, phase: str, pg: Outcome, hr: Outcome, synced: bool) -> None:
        verdict = compare(pg, hr, ordered=False)
        result = {"case": name, "path": path, "phase": phase, "verdict": verdict.verdict}
        if verdict.diff:
            result["diff"] = verdict.diff + ("" if synced else " (source not caught up)")
        self.results.append(result)

    def prepare(self) -> None:
        """Create the table, the source and every case's view (before other work, so the pipeline takes them up in
        the same start)."""
        started = time.monotonic()
        self.table_cases = load_cases(CASES_DIR / "table.sql")
        self.source_cases = load_cases(CASES_DIR / "source.sql")
        self.create()
        self.create_views("table", self.table_cases)
        self.create_views("source", self.source_cases)
        self.timings["create"] = round(time.monotonic() - started, 1)

    def run(self) -> list[dict[str, Any]]:
        phases: list[tuple[str, Callable[[], None]]] = [
            ("inserts", self._inserts), ("updates", self._updates), ("replacements", self._replacements),
            ("deletes", self._deletes)]
        for phase, write in phases:
            started = time.monotonic()
            write()
            # the first read after a write waits for the pipeline (longest for a new table): not a comparison
            self.hr.run(f"SELECT count(*) FROM {TABLE}", _SOURCE_WAIT_S)
            self.check("table", phase, self.table_cases)
            if phase in ("inserts", "replacements"):  # a source takes new bodies and replacements only
                synced = self.wait_for_source()
                self.check("source", phase, self.source_cases, synced)
            self.timings[phase] = round(time.monotonic() - started, 1)
        return self.results

    def _inserts(self) -> None:
        self.both(f"INSERT INTO {TABLE} VALUES " + ", ".join(table_row(key, 0) for key in range(1, 61)))
        self.post(self.next_bodies(range(1, 41), 0))

    def _updates(self) -> None:
        self.both(f"UPDATE {TABLE} SET a = a + 3, g = 'g9', x = x * 2 WHERE id % 4 = 1")
        self.both(f"UPDATE {TABLE} SET n = n * -1, j = '{{\"k\": \"k9\", \"v\": 100, \"o\": {{}}}}' WHERE id % 5 = 2")
        self.both(f"UPDATE {TABLE} SET a = NULL WHERE id % 9 = 3")

    def _replacements(self) -> None:
        rows = ", ".join(table_row(key, 1) for key in range(40, 81))
        self.both(f"INSERT INTO {TABLE} VALUES {rows} ON CONFLICT (id) DO UPDATE SET g = EXCLUDED.g, a = EXCLUDED.a, "
                  "b = EXCLUDED.b, n = EXCLUDED.n, x = EXCLUDED.x, j = EXCLUDED.j, f = EXCLUDED.f, gen = EXCLUDED.gen")
        self.post(self.next_bodies(range(20, 51), 1))

    def _deletes(self) -> None:
        self.both(f"DELETE FROM {TABLE} WHERE id % 3 = 0")
        self.both(f"DELETE FROM {TABLE} WHERE a IS NULL")


def run_view_cases(cases: ViewCases) -> list[dict[str, Any]]:
    """Run the prepared cases' write phases and comparisons, then close their sessions."""
    try:
        results = cases.run()
        print(f"view cases: seconds per phase {cases.timings}", flush=True)
        return results
    finally:
        cases.close()


def view_score(results: list[dict[str, Any]]) -> tuple[int, int]:
    """(checks equal to PostgreSQL, checks): a refused view or a failed write counts as a check that failed."""
    return sum(r["verdict"] == SAME for r in results), len(results)


def view_table(results: list[dict[str, Any]]) -> str:
    lines = [f"{'case':<22} {'path':<18} {'phase':<13} verdict"]
    for r in results:
        lines.append(f"{r['case']:<22} {r['path']:<18} {r['phase']:<13} {r['verdict']} {r.get('diff', '')[:150]}")
    same, total = view_score(results)
    lines.append(f"view cases: {same}/{total} checks equal PostgreSQL")
    return "\n".join(lines)
