"""kill -9 a server whose grouped view feeds a POSTGRES and a PARQUET sink, and fence off zombie runtimes (issue 6).

One real PostgreSQL 15 and one headrace server on a temporary data dir. Webhooks (new events, re-sends of ids with
another group and value, exact duplicates) flow into an IDEMPOTENT source; a GROUP BY view over it changes groups
(a re-sent `solo` event empties its old group, so the sinks also delete), and two sinks copy the view:
INTO POSTGRES (remote store authoritative, fenced checkpoint row) and INTO PARQUET (recovery log, staged files
applied at Acknowledge). The server is killed with SIGKILL, then restarted on the same data dir:
  * at random moments while webhooks are posted and sink transactions commit;
  * through the fail point `HEADRACE_FAILPOINTS=sink_after_commit:<n>` (src/headrace/failpoints.py): the server kills
    its own process group on the n-th sink commit, between the commit and its Acknowledge;
  * once with zombie runtimes open: while the server runs, the test opens its own runtime for each sink (the same
    MaterializationSpec, built from the server's catalog with `sink_spec`) against the built-in driver hosted in
    the test; the PARQUET zombie even stages a transaction and logs it in its own recovery log. After the restart
    the server's sinks have opened again (bumping the fences), so both zombies must get FencedOff and leave no trace.
Every webhook answered 200 must count; those that got no answer are posted again after the restart. At the end
(and once in between) each target must equal the view, the view its recomputation over the source and the source
the last body sent per id; PostgreSQL's transaction history and the Parquet manifest must list no transaction twice.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.dataset as ds
import pytest

from headrace.catalog.catalog import CATALOG_FILE
from headrace.materialize.drivers.builtin import BuiltinDriver, builtin_driver
from headrace.materialize.protocol import FencedOff, MaterializationSpec
from headrace.materialize.recovery import RecoveryLog
from headrace.materialize.runtime import Runtime
from headrace.sink.configs import endpoint_of
from headrace.sink.inputs import SinkInput
from headrace.sink.runner import sink_spec
from headrace.sql.sink_statements import connection_from_create_sql, sink_from_create_sql
from headrace.sql.view_serving import INTERNAL_SCHEMA
from tests.e2e.server_process import HeadraceProcess
from tests.e2e.webhook_client import post_all_acknowledged, post_webhook
from tests.materialize.drivers.conftest import HostedDriver
from tests.real_servers.postgres import PostgresCluster

pytestmark = pytest.mark.e2e

SOURCE = "CREATE SOURCE ev FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id')"
GROUP_COLUMNS = "body->>'g' AS g, count(*) AS n, sum((body->>'v')::int) AS total, max((body->>'v')::int) AS hi"
VIEW = f"CREATE MATERIALIZED VIEW agg AS SELECT {GROUP_COLUMNS} FROM ev GROUP BY body->>'g'"
RECOMPUTED = f"SELECT {GROUP_COLUMNS} FROM ev GROUP BY body->>'g'"
COLUMNS = ("g", "n", "total", "hi")
PG_SCHEMA, PG_TABLE = "chaos", "agg"
PG_SINK, PARQUET_SINK = "agg_pg", "agg_pq"
PG_SECRET = "chaos_pg_url"
FAILPOINT_MESSAGE = "fail point sink_after_commit reached"
ZOMBIE_UPTO = 2 ** 62  # a checkpoint no real commit has: found anywhere, the zombie's commit got through
ZOMBIE_GROUP = "zombie"
Rows = list[tuple[Any, ...]]


# ---------------------------------------------------------------------------------------------- traffic




class Traffic:
    """Webhook bursts and what the source must end up holding: per id, the last body sent. An id whose last body
    got no 200 yet is posted again by every later burst until one is answered (a newer body replaces it)."""

    def __init__(self, url: str, rng: random.Random) -> None:
        self.url = url
        self.rng = rng
        self.intended: dict[str, dict[str, Any]] = {}
        self.unanswered: set[str] = set()
        self.posted = 0
        self.answered = 0
        self.generation = 0
        self._next_number = 0

    def _body(self, number: int) -> dict[str, Any]:
        """Event `number` as sent now: every re-send moves it to another group with another value; a `solo`
        event is alone in its group, so a re-send deletes one group of the view and creates another."""
        generation = self.generation
        group = f"solo{number}-{generation}" if number % 7 == 0 else f"g{(number * 3 + generation) % 6}"
        return {"id": f"e{number}", "g": group, "v": (number * 13 + generation * 7) % 100 - 40, "gen": generation}

    def burst(self) -> None:
        """10 new events, up to 8 re-sends with changed bodies, the unanswered ones again, 3 exact duplicates."""
        self.generation += 1
        resent = self.rng.sample(sorted(self.intended), min(8, len(self.intended)))
        numbers = [*range(self._next_number, self._next_number + 10), *(int(event_id[1:]) for event_id in resent)]
        self._next_number += 10
        for number in numbers:
            body = self._body(number)
            self.intended[body["id"]] = body
            self.unanswered.add(body["id"])
        bodies = [self.intended[event_id] for event_id in sorted(self.unanswered)]  # one body per id
        bodies += self.rng.sample(bodies, min(3, len(bodies)))
        results = asyncio.run(post_all_acknowledged(self.url, bodies))
        self.posted += len(bodies)
        for body, answered in zip(bodies, results):
            if answered and self.intended[body["id"]] is body:
                self.unanswered.discard(body["id"])
                self.answered += 1

    def run_until(self, stop: threading.Event, pause: float = 0.3) -> None:
        while not stop.is_set():
            self.burst()
            stop.wait(pause)

    def expected_view(self) -> Rows:
        groups: dict[str, list[int]] = {}
        for body in self.intended.values():
            groups.setdefault(body["g"], []).append(body["v"])
        return normalized((g, len(values), sum(values), max(values)) for g, values in groups.items())


class Background:
    """Traffic in a thread of its own, so the test can kill the server while webhooks are in flight."""

    def __init__(self, traffic: Traffic) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=traffic.run_until, args=(self._stop,), name="webhook-traffic")

    def __enter__(self) -> Background:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "the webhook traffic did not stop"


# ---------------------------------------------------------------------------------------------- reading state


def query(process: HeadraceProcess, sql: str, params: Any = None) -> Rows:
    with psycopg.connect(process.dsn, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def normalized(rows: Any) -> Rows:
    """Rows compared by value: decimals as ints (or floats), sorted."""
    def value(item: Any) -> Any:
        if isinstance(item, Decimal):
            return int(item) if item == item.to_integral_value() else float(item)
        return item
    return sorted(tuple(value(item) for item in row) for row in rows)


def sink_status(process: HeadraceProcess) -> dict[str, tuple[Any, ...]]:
    """Per sink: (state, position in ms or None, transactions, lag_transactions, last_error)."""
    rows = query(process, "SELECT name, state, position, transactions, lag_transactions, last_error "
                          "FROM headrace_internal.sink_status")
    return {name: (state, None if position is None else round(position.timestamp() * 1000), transactions, lag,
                   error) for name, state, position, transactions, lag, error in rows}


def view_latest_commit(process: HeadraceProcess) -> int | None:
    """The view's last commit timestamp (ms): that of SUBSCRIBE's snapshot rows."""
    with psycopg.connect(process.dsn) as conn:
        conn.execute("DECLARE latest CURSOR FOR SUBSCRIBE agg")
        rows = conn.execute("FETCH ALL latest WITH (timeout = '1s')").fetchall()
        conn.rollback()
    return int(rows[0][0]) if rows else None


def postgres_rows(dsn: str) -> Rows:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return normalized(conn.execute(f"SELECT {', '.join(COLUMNS)} FROM {PG_SCHEMA}.{PG_TABLE}").fetchall())


def parquet_rows(directory: Path) -> Rows:
    table = ds.dataset(str(directory), format="parquet").to_table(columns=list(COLUMNS))
    return normalized(zip(*(table[name].to_pylist() for name in COLUMNS)))


def parquet_manifest(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "_manifest.json").read_text())


def settle(check: Callable[[], list[str]], timeout: float, what: str) -> None:
    """Wait until `check` finds no problem; fail with the problems of the last try."""
    deadline = time.monotonic() + timeout
    while True:
        problems = check()
        if not problems:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still wrong after {timeout:.0f} s: " + "; ".join(problems)[:4000])
        time.sleep(1.0)


class Targets:
    """The server, PostgreSQL and the Parquet dataset (if there is a PARQUET sink), and what must hold between them
    once traffic stops."""

    def __init__(self, process: HeadraceProcess, traffic: Traffic, pg_dsn: str, parquet_dir: Path | None) -> None:
        self.process = process
        self.traffic = traffic
        self.pg_dsn = pg_dsn
        self.parquet_dir = parquet_dir

    def problems(self) -> list[str]:
        held = query(self.process, "SELECT body->>'id', (body->>'gen')::int FROM ev")
        intended = {event_id: body["gen"] for event_id, body in self.traffic.intended.items()}
        problems = []
        if len(held) != len(dict(held)):
            problems.append(f"the source holds {len(held) - len(dict(held))} ids twice")
        if dict(held) != intended:
            wrong = {i: (dict(held).get(i), intended.get(i)) for i in set(dict(held)) | set(intended)
                     if dict(held).get(i) != intended.get(i)}
            problems.append(f"source (held, sent) generations differ for {len(wrong)} ids: {sorted(wrong.items())[:5]}")
        view = normalized(query(self.process, f"SELECT {', '.join(COLUMNS)} FROM agg"))
        if view != normalized(query(self.process, RECOMPUTED)):
            problems.append("the view differs from its recomputation over the source")
        if view != self.traffic.expected_view():
            problems.append("the view differs from the groups of the bodies sent")
        latest = view_latest_commit(self.process)
        for name, (state, position, _, lag, error) in sorted(sink_status(self.process).items()):
            if (state, lag, position) != ("running", 0, latest):
                problems.append(f"sink {name}: {state}, lag {lag}, position {position} (view: {latest}), "
                                f"last error {error}")
        if postgres_rows(self.pg_dsn) != view:
            problems.append("the PostgreSQL table differs from the view")
        if self.parquet_dir is not None and parquet_rows(self.parquet_dir) != view:
            problems.append("the Parquet dataset differs from the view")
        return problems

    def wait_consistent(self, timeout: float = 240) -> None:
        """Post the unanswered webhooks until answered, then wait until everything agrees."""
        deadline = time.monotonic() + 60
        while self.traffic.unanswered:
            if time.monotonic() > deadline:
                sample = self.traffic.intended[min(self.traffic.unanswered)]
                answer = post_webhook(self.traffic.url, json.dumps(sample).encode())
                raise AssertionError(f"{len(self.traffic.unanswered)} webhooks never answered 200; one of them now "
                                     f"gets {answer.status_code} {answer.text[:300]!r}")
            bodies = [self.traffic.intended[event_id] for event_id in sorted(self.traffic.unanswered)]
            for body, answered in zip(bodies, asyncio.run(post_all_acknowledged(self.traffic.url, bodies))):
                if answered:
                    self.traffic.unanswered.discard(body["id"])
                    self.traffic.answered += 1
        settle(self.problems, timeout, "targets equal to the view, the view to the source")


# ---------------------------------------------------------------------------------------------- the server


def sink_commits(process: HeadraceProcess) -> int:
    return sum(status[2] for status in sink_status(process).values())


def wait_until(process: HeadraceProcess, predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert process.process is not None and process.process.poll() is None, process.output()[-3000:]
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {sink_status(process)}"
        time.sleep(0.2)


def kill_while_busy(process: HeadraceProcess, traffic: Traffic, rng: random.Random,
                    restart_env: dict[str, str] | None = None) -> None:
    """SIGKILL at a random moment while webhooks are posted and the sinks commit them, then restart (with
    `restart_env`, e.g. a fail point for the next round)."""
    held = query(process, "SELECT count(*) FROM ev")[0][0]
    with Background(traffic):
        # Not the sinks' catch-up right after a start: the pipeline commits this round's webhooks, and the sinks
        # follow them.
        wait_until(process, lambda: query(process, "SELECT count(*) FROM ev")[0][0] > held, 180,
                   "the pipeline to commit webhooks")
        commits = sink_commits(process)
        wait_until(process, lambda: sink_commits(process) >= commits + 2, 60, "sink commits")
        time.sleep(rng.uniform(0.1, 2.5))
        process.kill9()
    process.start(env=restart_env)


def failpoint_env(rng: random.Random) -> dict[str, str]:
    return {"HEADRACE_FAILPOINTS": f"sink_after_commit:{rng.randint(3, 8)}"}


def parquet_sink_pending(process: HeadraceProcess, parquet_dir: Path) -> list[str]:
    """The transactions the PARQUET sink's recovery log holds as committed and not yet applied."""
    sink_id = parquet_manifest(parquet_dir)["materialization"].removeprefix("sink_")
    log = RecoveryLog(process.data_dir / "sinks" / sink_id / "recovery.json")
    return sorted(log.state.driver_state.get("pending", {}))


def kill_through_failpoint(process: HeadraceProcess, traffic: Traffic, parquet_dir: Path,
                           restart_env: dict[str, str] | None = None) -> list[str]:
    """The server was started with the fail point armed: traffic until it kills itself between a sink's commit
    and its Acknowledge, then restart (with `restart_env`: the next round's fail point, or none). Returns the
    PARQUET transactions left to apply (none when the POSTGRES sink's commit was the one that fired)."""
    assert process.process is not None
    fired = process.output().count(FAILPOINT_MESSAGE)
    with Background(traffic):
        deadline = time.monotonic() + 240
        while process.process.poll() is None:
            assert time.monotonic() < deadline, f"the fail point did not fire: {sink_status(process)}"
            time.sleep(0.1)
    assert process.process.returncode == -9
    process.kill9()  # reap the rest of the process group
    assert process.output().count(FAILPOINT_MESSAGE) == fired + 1, process.output()[-3000:]
    pending = parquet_sink_pending(process, parquet_dir)
    process.start(env=restart_env)
    return pending


# ---------------------------------------------------------------------------------------------- zombies


def server_sink_spec(data_dir: Path, sink_name: str, secrets: dict[str, str],
                     parquet_dir: Path) -> MaterializationSpec:
    """The sink's MaterializationSpec as the server builds it (sink_spec over its catalog entry and endpoint).
    The view's column types come from the PARQUET sink's manifest, which holds the types of the server's spec
    (the test cannot open the running server's DuckDB store to describe the view)."""
    catalog = json.loads((data_dir / CATALOG_FILE).read_text())
    sink = next(s for s in (sink_from_create_sql(e["id"], e["create_sql"]) for e in catalog["sinks"])
                if s.name == sink_name)
    connections = [connection_from_create_sql(e["id"], e["create_sql"]) for e in catalog.get("connections", ())]
    endpoint = endpoint_of(
        sink, lambda schema, name: next((c for c in connections if (c.schema, c.name) == (schema, name)), None),
        lambda name: secrets[name].encode() if name in secrets else None, data_dir)
    view = next(v for v in catalog["views"] if v["name"] == sink.relation_name)
    source_id = catalog["items"][0]["id"]  # the view's input: the only source
    manifest = parquet_manifest(parquet_dir)
    sink_input = SinkInput("view", f"{sink.relation_schema}.{sink.relation_name}",
                           (INTERNAL_SCHEMA, f"view_{view['id']}"), f"source_{source_id}", "",
                           tuple(manifest["key"]))
    return sink_spec(sink, endpoint, sink_input, list(manifest["columns"].items()))


def zombie_documents(spec: MaterializationSpec) -> list[tuple[int, list[Any], dict[str, Any]]]:
    """A new group and a bogus version of an existing one: neither may ever reach a target."""
    binding = spec.bindings[0]
    assert binding.key == ("g",), f"the sink of a GROUP BY g view is keyed by g, not {binding.key}"
    return [(0, [group], {"g": group, "n": -999, "total": -999, "hi": -999}) for group in (ZOMBIE_GROUP, "g0")]


@pytest.fixture
def hosted_drivers() -> Iterator[dict[str, HostedDriver]]:
    hosted: dict[str, HostedDriver] = {}
    try:
        for name in ("postgres", "parquet"):
            driver: BuiltinDriver = builtin_driver(name)
            hosted[name] = HostedDriver(driver.transactor_factory, driver.connector())
        yield hosted
    finally:
        for driver_host in hosted.values():
            driver_host.stop()


def open_zombie(hosted: HostedDriver, spec: MaterializationSpec, recovery_log: RecoveryLog | None = None) -> Runtime:
    runtime = hosted.runtime(spec, recovery_log=recovery_log)
    runtime.validate()
    runtime.apply()
    runtime.open()
    return runtime


def create_source_view_and_sinks(process: HeadraceProcess, pg_dsn: str, parquet_dir: Path | None) -> None:
    """The source, its GROUP BY view, a POSTGRES sink of the view and (with `parquet_dir`) a PARQUET one."""
    statements = [SOURCE, VIEW, f"CREATE SECRET {PG_SECRET} AS '{pg_dsn}'",
                  f"CREATE CONNECTION chaos_pg TO POSTGRES (URL = SECRET {PG_SECRET})",
                  f"CREATE SINK {PG_SINK} FROM agg INTO POSTGRES (CONNECTION chaos_pg, TABLE '{PG_SCHEMA}.{PG_TABLE}')"]
    if parquet_dir is not None:
        statements.append(f"CREATE SINK {PARQUET_SINK} FROM agg INTO PARQUET (PATH '{parquet_dir}', BUCKETS 4)")
    with psycopg.connect(process.dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


# ---------------------------------------------------------------------------------------------- the test


@pytest.mark.timeout(900)
def test_sinks_survive_kill_9_and_fence_off_zombies(tmp_path: Path,
                                                   hosted_drivers: dict[str, HostedDriver]) -> None:
    rng = random.Random(6)
    parquet_dir = tmp_path / "parquet" / "agg"
    started = time.monotonic()
    with PostgresCluster(tmp_path / "pg") as cluster:
        pg_dsn = cluster.create_database("chaos")
        # PARQUET sinks write only inside the server's --allow-directory list (issue 20)
        process = HeadraceProcess(tmp_path / "data", ["--allow-directory", str(tmp_path / "parquet")])
        traffic = Traffic(process.webhook_url("ev"), rng)
        targets = Targets(process, traffic, pg_dsn, parquet_dir)
        try:
            process.start()
            create_source_view_and_sinks(process, pg_dsn, parquet_dir)

            # Two fail point rounds (either sink's commit may be the one that fires), the second armed straight
            # from the first one's restart: a random kill between them covered the same boundary as the first and
            # the last random kills, and cost a Spark start of its own.
            kill_while_busy(process, traffic, rng, restart_env=failpoint_env(rng))
            left_to_apply = kill_through_failpoint(process, traffic, parquet_dir, restart_env=failpoint_env(rng))
            left_to_apply += kill_through_failpoint(process, traffic, parquet_dir)
            targets.wait_consistent()  # once in between: nothing lost or doubled so far, and the sinks idle

            # Zombies: runtimes opened while the server runs (each fences the server's sink off for a while).
            pg_spec = server_sink_spec(process.data_dir, PG_SINK, {PG_SECRET: pg_dsn}, parquet_dir)
            parquet_spec = server_sink_spec(process.data_dir, PARQUET_SINK, {}, parquet_dir)
            assert pg_spec.name.startswith("sink_") and parquet_spec.name.startswith("sink_")
            pg_zombie = open_zombie(hosted_drivers["postgres"], pg_spec)
            zombie_log = RecoveryLog(tmp_path / "zombie-recovery.json")
            parquet_zombie = open_zombie(hosted_drivers["parquet"], parquet_spec, zombie_log)
            # The PARQUET zombie gets as far as it can: its transaction staged and in its recovery log.
            parquet_zombie.transact(zombie_documents(parquet_spec), {"upto": ZOMBIE_UPTO})
            zombie_staged = list(zombie_log.state.driver_state["pending"])
            assert len(zombie_staged) == 1 and (parquet_dir / "_staging" / zombie_staged[0]).is_dir()

            process.kill9()
            process.start()  # each sink's Open bumps its fence past the zombies'
            settle(lambda: [f"{name}: {status}" for name, status in sink_status(process).items()
                            if status[0] != "running"], 60, "both sinks opened again")
            with pytest.raises(FencedOff):
                pg_zombie.transact(zombie_documents(pg_spec), {"upto": ZOMBIE_UPTO})
            pg_zombie.close()
            assert not (parquet_dir / "_staging" / zombie_staged[0]).exists(), \
                "the server's Open discards staged files its recovery log does not name"
            with pytest.raises(FencedOff):
                parquet_zombie.wait_acknowledged()  # would apply the zombie's staged transaction
            parquet_zombie.close()

            kill_while_busy(process, traffic, rng)
            with Background(traffic):
                time.sleep(3)  # a last burst after the fifth restart
            targets.wait_consistent()

            # Every transaction applied once, none of the zombies'.
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                history = conn.execute(
                    "SELECT materialization, (checkpoint->>'upto')::bigint "
                    f"FROM {PG_SCHEMA}.headrace_sink_transactions ORDER BY committed_at").fetchall()
                checkpoints = conn.execute(
                    f"SELECT materialization, (checkpoint->>'upto')::bigint, fence "
                    f"FROM {PG_SCHEMA}.headrace_sink_checkpoints").fetchall()
            uptos = [upto for materialization, upto in history if materialization == pg_spec.name]
            assert {m for m, _ in history} == {pg_spec.name}
            assert len(uptos) == len(set(uptos)) and uptos == sorted(uptos) and len(uptos) >= 5, uptos
            assert ZOMBIE_UPTO not in uptos
            assert len(checkpoints) == 1 and checkpoints[0][1] == uptos[-1] == view_latest_commit(process)
            manifest = parquet_manifest(parquet_dir)
            assert len(manifest["applied"]) == len(set(manifest["applied"])) >= 5
            assert zombie_staged[0] not in manifest["applied"]
            assert set(left_to_apply) <= set(manifest["applied"]), "a transaction committed before a crash was lost"
            assert not list((parquet_dir / "_staging").glob("*"))
            assert ZOMBIE_GROUP not in {row[0] for row in postgres_rows(pg_dsn) + parquet_rows(parquet_dir)}
            assert process.output().count(FAILPOINT_MESSAGE) == 2
            print(f"sink chaos: {traffic.posted} webhooks posted, {traffic.answered} answered, "
                  f"{len(traffic.intended)} ids, {len(traffic.expected_view())} groups, {len(uptos)} PostgreSQL "
                  f"transactions, {len(manifest['applied'])} Parquet transactions ({len(left_to_apply)} applied "
                  f"after a fail point's crash), fences {checkpoints[0][2]}/"
                  f"{manifest['fence']}, {time.monotonic() - started:.0f} s")
        finally:
            process.stop()
