"""The chaos run of issue 20 (`make chaos`): kill -9 the whole process group HEADRACE_CHAOS_KILLS times (20) at random
moments during HEADRACE_CHAOS_SECONDS (300) of retrying senders into an IDEMPOTENT source with a GROUP BY view and a
POSTGRES sink of it. Senders re-send whatever got no 200, and re-send acknowledged events with changed bodies and
as exact duplicates. Afterwards: no acknowledged request lost, none doubled, in the source, the view and the sink;
every sink transaction applied once."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess
from tests.e2e.test_sink_faults import (PG_SCHEMA, Background, Targets, Traffic, create_source_view_and_sinks)
from tests.real_servers.postgres import PostgresCluster

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(3600)
def test_kill_9_during_retrying_senders(tmp_path: Path) -> None:
    seconds = float(os.environ.get("HEADRACE_CHAOS_SECONDS", "300"))
    kills = int(os.environ.get("HEADRACE_CHAOS_KILLS", "20"))
    seed = int(os.environ.get("HEADRACE_CHAOS_SEED", str(random.SystemRandom().getrandbits(32))))
    rng = random.Random(seed)
    started = time.monotonic()
    with PostgresCluster(tmp_path / "pg") as cluster:
        pg_dsn = cluster.create_database("chaos")
        process = HeadraceProcess(tmp_path / "data")
        traffic = Traffic(process.webhook_url("ev"), rng)
        targets = Targets(process, traffic, pg_dsn, parquet_dir=None)
        try:
            process.start()
            create_source_view_and_sinks(process, pg_dsn, parquet_dir=None)
            restarts: list[float] = []
            with Background(traffic):  # posts bursts throughout, the dead server's refusals included
                for kill in range(kills):
                    time.sleep(max(0.0, seconds / kills * rng.uniform(0.3, 1.7) - (restarts[-1] if restarts else 0)))
                    process.kill9()
                    restart_started = time.monotonic()
                    process.start(timeout=120)
                    restarts.append(time.monotonic() - restart_started)
            targets.wait_consistent(timeout=600)
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                uptos = [upto for (upto,) in conn.execute(
                    f"SELECT (checkpoint->>'upto')::bigint FROM {PG_SCHEMA}.headrace_sink_transactions "
                    "ORDER BY committed_at")]
            assert len(uptos) == len(set(uptos)) and uptos == sorted(uptos), "a sink transaction applied twice"
            print(f"chaos (seed {seed}): {kills} kill -9 in {time.monotonic() - started:.0f} s, restarts "
                  f"{min(restarts):.1f}-{max(restarts):.1f} s; {traffic.posted} webhooks posted, {traffic.answered} "
                  f"acknowledged, {len(traffic.intended)} ids, {len(traffic.expected_view())} groups, "
                  f"{len(uptos)} sink transactions; nothing lost or doubled")
        finally:
            process.stop()
