"""Documents/s a POSTGRES sink materializes exactly once from a view, on a real server, against raw COPY.

    .venv/bin/python bench/sink_end_to_end.py [--keys 100000]

A throwaway PostgreSQL 15 (fsync=on, tests/real_servers/postgres.py) and a real `headrace up` (local[2] Spark).
A webhook source and a view `per_key` with GROUP BY over `--keys` keys (count, sum, max, a text column): the
server is stopped, one event per key is appended to the source's log with the real log writer, the server is
started again and the view fills. Then:

1. Snapshot: `CREATE SINK ... INTO POSTGRES`; the figure is keys / (time from the statement to the PostgreSQL table
   holding every key with the sink's position at the view's last commit). It covers all the sink does: validate,
   apply (CREATE TABLE), the snapshot read from the serving store, COPY into a staging table, the merge, the
   checkpoint and fence, commit.
2. Updates: the server is stopped, one more event per key is appended, the server is started again: every key
   changes. The figure is keys / (time from the view's first new commit being visible to the sink caught up with
   its last). It includes any wait for the pipeline's later commits, so it is a floor of the sink's own rate.
3. The ceilings, in the same run against the same PostgreSQL: a raw COPY of the same rows (the sink's table
   exported as CSV beforehand) into an empty table like the sink's, committed; and for updates what PostgreSQL
   alone takes for the statements a merge needs (COPY into a temporary table, one UPDATE ... FROM, commit).

Target (issue 6): >= 50,000 docs/s and >= 50% of the raw COPY rate. The load average is printed: figures are only
meaningful on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headrace.log.segments import SegmentedLog  # noqa: E402
from headrace.webhook.record import WebhookRecord, encode  # noqa: E402
from tests.e2e.server_process import HeadraceProcess, wait_for  # noqa: E402
from tests.real_servers.postgres import PostgresCluster  # noqa: E402
from sink_postgres import copy_seconds  # noqa: E402 - bench/, this script's directory
from view_pipeline import scalar  # noqa: E402

VIEW = """CREATE MATERIALIZED VIEW per_key AS
SELECT body->>'k' AS k, count(*) AS n, sum((body->>'v')::bigint) AS total, max((body->>'v')::bigint) AS hi,
       max(body->>'label') AS label
FROM events GROUP BY body->>'k'"""
SINK_TABLE = "public.per_key"


def append_events(data_dir: Path, keys: int, round_: int) -> None:
    """One event per key into the source's log, as the webhook endpoint would have written them."""
    rng = random.Random(round_)
    (log_dir,) = [d for d in (data_dir / "logs").iterdir() if d.is_dir()]
    log = SegmentedLog(log_dir)
    now_us = time.time_ns() // 1000
    chunk = 20_000
    for start in range(0, keys, chunk):
        log.append([encode(WebhookRecord(now_us, None, None, json.dumps(
            {"k": f"key-{n:07d}", "v": rng.randint(0, 1_000_000), "label": f"label {n % 97} round {round_}"},
            separators=(",", ":")).encode())) for n in range(start, min(keys, start + chunk))])
    log.sync()
    log.close()


class SinkProbe:
    """Polls whether the PostgreSQL table holds `events` events over every key and the sink has nothing left to
    send, over connections kept open (a new connection per poll would blur the timing by its own cost)."""

    def __init__(self, server: HeadraceProcess, target_dsn: str) -> None:
        self._headrace = psycopg.connect(server.dsn, autocommit=True)
        self._target = psycopg.connect(target_dsn, autocommit=True)

    def caught_up(self, events: int) -> bool:
        status = self._headrace.execute("SELECT lag_transactions FROM headrace_internal.sink_status "
                                        "WHERE name = 'per_key_pg'").fetchone()
        if status is None or status[0] != 0:
            return False
        try:
            return self._target.execute(f"SELECT coalesce(sum(n), 0) FROM {SINK_TABLE}").fetchone()[0] == events
        except psycopg.errors.UndefinedTable:
            return False

    def last_transaction(self) -> tuple[int, float]:
        """The sink's last committed transaction: documents, and seconds from reading them to the commit."""
        documents, seconds = self._headrace.execute(
            "SELECT last_transaction_documents, last_transaction_seconds FROM headrace_internal.sink_status "
            "WHERE name = 'per_key_pg'").fetchone()
        return documents, seconds

    def close(self) -> None:
        self._headrace.close()
        self._target.close()


def restart_with_events(server: HeadraceProcess, keys: int, round_: int) -> None:
    server.stop()
    started = time.monotonic()
    append_events(server.data_dir, keys, round_)
    print(f"appended {keys:,} events to the source's log in {time.monotonic() - started:.1f} s", flush=True)
    server.start(timeout=180)


def raw_update_seconds(dsn: str, payload: bytes, repeats: int = 3) -> float:
    """PostgreSQL alone updating every row of raw_copy: COPY into a temporary table, UPDATE ... FROM, commit."""
    with psycopg.connect(dsn) as conn:
        columns = [row[0] for row in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'raw_copy'::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum")]
        assignments = ", ".join(f'"{c}" = s."{c}"' for c in columns if c != "k")
        conn.execute("ANALYZE raw_copy")
        conn.execute("CREATE TEMPORARY TABLE staged (LIKE raw_copy) ON COMMIT DELETE ROWS")
        conn.commit()
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            with conn.cursor().copy("COPY staged FROM STDIN (FORMAT csv)") as copy:
                copy.write(payload)
            conn.execute(f"UPDATE raw_copy AS t SET {assignments} FROM staged AS s WHERE t.k = s.k")
            conn.commit()
            best = min(best, time.perf_counter() - started)
    return best


def export_csv(dsn: str) -> bytes:
    with psycopg.connect(dsn) as conn:
        with conn.cursor().copy(f"COPY {SINK_TABLE} TO STDOUT (FORMAT csv)") as copy:
            return b"".join(bytes(chunk) for chunk in copy)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=100_000)
    args = parser.parse_args()
    keys = args.keys
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="sink-e2e-") as scratch:
        with PostgresCluster(Path(scratch) / "pg") as cluster:
            target = cluster.create_database("bench")
            server = HeadraceProcess(Path(scratch) / "data")
            server.start(timeout=180)
            try:
                with psycopg.connect(server.dsn, autocommit=True) as conn:
                    conn.execute("CREATE SOURCE events FROM WEBHOOK BODY FORMAT JSON")
                    conn.execute(VIEW)
                    conn.execute(f"CREATE SECRET bench_pg AS '{target}'")
                    conn.execute("CREATE CONNECTION bench_pg TO POSTGRES (URL = SECRET bench_pg)")
                restart_with_events(server, keys, 1)
                wait_for(lambda: scalar(server.dsn, "SELECT coalesce(sum(n), 0) FROM per_key") == keys,
                         timeout=900, interval=0.2, message=f"the view to hold {keys} events")
                assert scalar(server.dsn, "SELECT count(*) FROM per_key") == keys

                probe = SinkProbe(server, target)
                with psycopg.connect(server.dsn, autocommit=True) as conn:
                    started = time.monotonic()
                    conn.execute(f"CREATE SINK per_key_pg FROM per_key INTO POSTGRES "
                                 f"(CONNECTION bench_pg, TABLE '{SINK_TABLE}')")
                    created = time.monotonic() - started
                wait_for(lambda: probe.caught_up(keys), timeout=900, interval=0.005, message="the sink's snapshot")
                snapshot = time.monotonic() - started
                snapshot_transaction = probe.last_transaction()
                probe.close()
                assert scalar(target, f"SELECT count(*) FROM {SINK_TABLE}") == keys

                restart_with_events(server, keys, 2)
                wait_for(lambda: scalar(server.dsn, "SELECT coalesce(sum(n), 0) FROM per_key") > keys,
                         timeout=900, interval=0.02, message="the view's first new commit")
                first_commit = time.monotonic()
                wait_for(lambda: scalar(server.dsn, "SELECT coalesce(sum(n), 0) FROM per_key") == 2 * keys,
                         timeout=900, interval=0.05, message="the view's last commit")
                view_done = time.monotonic()
                probe = SinkProbe(server, target)
                wait_for(lambda: probe.caught_up(2 * keys), timeout=900, interval=0.005, message="the sink's updates")
                updated = time.monotonic() - first_commit
                update_transaction = probe.last_transaction()
                probe.close()
                with psycopg.connect(server.dsn, autocommit=True) as conn:
                    transactions, documents = conn.execute(
                        "SELECT transactions, documents FROM headrace_internal.sink_status "
                        "WHERE name = 'per_key_pg'").fetchone()
                    assert conn.execute("SELECT count(*) FROM per_key").fetchone()[0] == keys
            finally:
                server.stop()
            assert scalar(target, f"SELECT count(*) FROM {SINK_TABLE} WHERE n = 2") == keys

            payload = export_csv(target)
            raw = copy_seconds(target, payload, f"CREATE TABLE raw_copy (LIKE {SINK_TABLE} INCLUDING ALL)")
            raw_update = raw_update_seconds(target, payload)

    raw_rate = keys / raw
    print(f"raw COPY of the same {keys:,} rows into an empty table like the sink's: {raw_rate:,.0f} rows/s "
          f"({raw * 1000:.0f} ms, best of 3)")
    print(f"raw update of {keys:,} rows (COPY into a temporary table + UPDATE ... FROM, committed): "
          f"{keys / raw_update:,.0f} rows/s ({raw_update * 1000:.0f} ms, best of 3)")
    print(f"POSTGRES sink, snapshot of a {keys:,}-key view: {keys / snapshot:,.0f} docs/s exactly once "
          f"({snapshot:.3f} s from CREATE SINK, of which the statement {created:.3f} s; "
          f"{keys / snapshot / raw_rate:.0%} of raw COPY)")
    documents, seconds = snapshot_transaction
    print(f"  its transaction ({documents:,} documents, from reading the snapshot out of the serving store to the "
          f"commit in PostgreSQL): {documents / seconds:,.0f} docs/s ({seconds:.3f} s; "
          f"{documents / seconds / raw_rate:.0%} of raw COPY)")
    print(f"POSTGRES sink, {keys:,} keys updated: {keys / updated:,.0f} docs/s ({updated:.3f} s from the view's "
          f"first new commit, of which {view_done - first_commit:.3f} s until its last; "
          f"{raw_update / updated:.0%} of raw update; since the restart the sink "
          f"sent {documents:,} documents in {transactions} transactions)")
    documents, seconds = update_transaction
    print(f"  its last transaction ({documents:,} documents, from reading the changes to the commit): "
          f"{documents / seconds:,.0f} docs/s ({seconds:.3f} s; {raw_update / seconds * documents / keys:.0%} of "
          f"raw update)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
