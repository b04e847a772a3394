"""kill -9 exactly between StartedCommit and Acknowledged, through webhooks into views (issue 5's Done-when).

The server runs with the fail point `HEADRACE_FAILPOINTS=after_started_commit:<n>` (src/headrace/failpoints.py):
on the n-th commit of the serving driver, once its StartedCommit is durable and written and before the runtime's
next Acknowledge is handled, every process of the server (server, pipeline, Spark's JVM) is killed with SIGKILL.
Spark has not recorded that batch as committed, so after the restart it replays it, and the serving store's
checkpoint must recognize it. Traffic carries duplicates and replacements; each round fires at another commit
number. After every restart each view equals a from-scratch recomputation in SQL over the source, and the source
holds every acknowledged event exactly once.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess, wait_for
from tests.e2e.webhook_client import post_all_acknowledged

pytestmark = pytest.mark.e2e

FAILPOINT_MESSAGE = "fail point after_started_commit reached"
SOURCE = "CREATE SOURCE ev FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id')"
GROUP_COLUMNS = """body->>'g' AS g, count(*) AS n, sum((body->>'v')::int) AS total, min((body->>'v')::int) AS lo,
       max((body->>'v')::int) AS hi, avg((body->>'v')::int) AS mean, array_agg(body->>'id') AS ids"""
AGGREGATES = f"CREATE MATERIALIZED VIEW agg AS SELECT {GROUP_COLUMNS} FROM ev GROUP BY body->>'g'"
AGGREGATES_RECOMPUTED = f"SELECT {GROUP_COLUMNS} FROM ev GROUP BY body->>'g'"
FILTERED = """CREATE MATERIALIZED VIEW positive AS
SELECT body->>'id' AS id, body->>'g' AS g, (body->>'v')::int AS v FROM ev WHERE (body->>'v')::int > 0"""
FILTERED_RECOMPUTED = "SELECT body->>'id', body->>'g', (body->>'v')::int FROM ev WHERE (body->>'v')::int > 0"


def body(event_id: int, generation: int) -> dict[str, Any]:
    """Event `event_id` as sent in `generation`: a later generation is a replacement with another group and value."""
    return {"id": f"e{event_id}", "g": f"g{(event_id + generation) % 5}",
            "v": (event_id * 11 + generation * 17) % 90 - 30, "gen": generation}




def query(process: HeadraceProcess, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(process.dsn, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def comparable(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Numbers as rounded floats (sum is numeric in one, int8 in the other); arrays as sorted tuples (array_agg keeps
    arrival order in the view, while a recomputation's order is unspecified)."""
    def value(v: Any) -> Any:
        if isinstance(v, list):
            return tuple(sorted(v))
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return v
        return round(float(v), 6)
    return sorted((tuple(value(v) for v in row) for row in rows), key=repr)


def views_match_source(process: HeadraceProcess) -> bool:
    pairs = [("SELECT g, n, total, lo, hi, mean, ids FROM agg", AGGREGATES_RECOMPUTED),
             ("SELECT id, g, v FROM positive", FILTERED_RECOMPUTED)]
    return all(comparable(query(process, view)) == comparable(query(process, recomputed))
               for view, recomputed in pairs)


def wait_until_dead(process: HeadraceProcess, timeout: float) -> None:
    assert process.process is not None
    process.process.wait(timeout=timeout)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # the pipeline and the JVM die with it (same process group)
        try:
            os.killpg(process.process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


def traffic_until_killed(process: HeadraceProcess, round_number: int, acknowledged: dict[str, int]) -> None:
    """Bursts of new events, exact duplicates and replacements of earlier events until the fail point kills the
    server; `acknowledged` maps each event answered 200 to the latest generation answered 200."""
    assert process.process is not None
    deadline = time.monotonic() + 300  # Spark's cold start on a loaded 2-core machine can take minutes
    burst = 0
    while process.process.poll() is None:
        assert time.monotonic() < deadline, "the fail point did not fire"
        generation = round_number * 1000 + burst
        first_new = len(acknowledged) + 1000 * round_number + 20 * burst
        new_events = [body(i, generation) for i in range(first_new, first_new + 12)]
        replacements = [body(int(event_id[1:]), generation) for event_id in list(acknowledged)[burst % 3::4][:8]]
        bodies = new_events + replacements
        bodies += bodies[:6]  # exact duplicates in the same burst
        results = asyncio.run(post_all_acknowledged(process.webhook_url("ev"), bodies, timeout=10))
        for payload, ok in zip(bodies, results):
            if ok:
                acknowledged[payload["id"]] = max(acknowledged.get(payload["id"], -1), payload["gen"])
        burst += 1
        time.sleep(0.5)  # a few bursts per pipeline transaction
    wait_until_dead(process, timeout=30)


def source_problems(process: HeadraceProcess, acknowledged: dict[str, int]) -> list[str]:
    """What is wrong with the source: an idempotency key held twice, an acknowledged event missing or older than
    acknowledged (a later generation that was durable when the server died is fine)."""
    rows = query(process, "SELECT body->>'id', (body->>'gen')::int FROM ev")
    held = dict(rows)
    problems = [f"{event_id} held twice" for event_id in held if [r[0] for r in rows].count(event_id) > 1] \
        if len(held) != len(rows) else []
    problems += [f"{event_id}: acknowledged generation {generation}, held {held.get(event_id)}"
                 for event_id, generation in acknowledged.items() if held.get(event_id, -1) < generation]
    return problems


def assert_source_and_views(process: HeadraceProcess, acknowledged: dict[str, int]) -> None:
    # The pipeline catches up after the restart: wait until the source shows what was acknowledged.
    wait_for(lambda: not source_problems(process, acknowledged) and views_match_source(process), timeout=120,
             message="the source holding each acknowledged event once and views equal to their recomputation")
    # and it stays so: nothing replayed twice on top
    time.sleep(2)
    assert source_problems(process, acknowledged) == []
    assert views_match_source(process)
    assert query(process, "SELECT sum(n) FROM agg")[0][0] == query(process, "SELECT count(*) FROM ev")[0][0]


def failpoint_at(commit_number: int) -> dict[str, str]:
    return {"HEADRACE_FAILPOINTS": f"after_started_commit:{commit_number}"}


# The second fail point is armed in the restart that replays the first one's batch: the replay and the checks after it
# take two commits at most (the backlog is one batch, a replayed one maybe two), so commit 6 falls in the second
# round's traffic. Three server starts instead of four (one with Spark each), and the second kill lands in a server
# that has itself replayed a batch.
ROUND_FAILPOINTS = (failpoint_at(6), None)


@pytest.mark.timeout(900)  # three server starts with Spark, two of them with a replay
def test_kill_9_between_started_commit_and_acknowledged(tmp_path: Path) -> None:
    process = HeadraceProcess(tmp_path / "data")
    acknowledged: dict[str, int] = {}
    try:
        process.start(env=failpoint_at(2))
        with psycopg.connect(process.dsn, autocommit=True) as conn:  # no commit before traffic: the fail point
            conn.execute(SOURCE)                                    # counts the data's transactions
            conn.execute(AGGREGATES)
            conn.execute(FILTERED)
        # Traffic once the query runs: posted during Spark's start it only piles up into a first batch of thousands
        # of rows (tens of seconds of view work on a busy machine) without reaching any other boundary.
        wait_for(lambda: "started ev (" in process.pipeline_log(), timeout=300, message="the source's query started")
        for round_number, next_failpoint in enumerate(ROUND_FAILPOINTS):
            fired_before = process.output().count(FAILPOINT_MESSAGE)
            traffic_until_killed(process, round_number, acknowledged)
            assert process.process is not None and process.process.returncode == -9  # the fail point fired
            assert process.output().count(FAILPOINT_MESSAGE) == fired_before + 1, process.output()[-3000:]

            process.start(env=next_failpoint)  # Spark replays the batch the serving store already holds
            assert_source_and_views(process, acknowledged)
    finally:
        process.stop()
