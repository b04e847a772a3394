"""Statements the store PostgreSQL answers (coordinator/passthrough.py): through headrace against the same
statements sent to the store directly, in the same run (issue 16: a non-indexed SELECT through headrace >= 80% of
the same query sent to the store directly).

One PostgreSQL 15 cluster is the store (headrace up --store <its database>) and the direct peer. A table only the
store keeps (`serial` makes it the store's: coordinator.Coordinator._table_only_the_store_keeps), 10,000 rows, is
read with pgbench -n -c <clients> -j 1 -T <seconds>, -M simple and extended:
  - point:   SELECT v FROM pt WHERE k = :k               (the primary key's index, in PostgreSQL)
  - scan:    SELECT count(*) FROM pt WHERE v LIKE '%' || :k || '%'  (not indexed: a sequential scan of 10,000 rows)
  - exprs:   SELECT :k / 2, :k::numeric * 1.5, md5(:k::text)  (no relation at all)
With the PostgreSQL serving store (headrace up --serving-store postgres, the default here), a headrace table `ht`
with the same rows, whose queries headrace checks (privileges, read-your-writes) before PostgreSQL runs them:
  - hscan:   SELECT count(*) FROM ht WHERE v LIKE '%' || :k || '%'  (the issue's case: not indexed)

    .venv/bin/python bench/store_passthrough.py [--seconds 10] [--clients 8]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.pgwire_select import pgbench  # noqa: E402
from tests.e2e.server_process import HeadraceProcess, wait_for  # noqa: E402
from tests.real_servers.postgres import new_store_database  # noqa: E402

ROWS = 10_000
QUERIES = {  # pgbench() sets :k to random(1, 10000) first
    "point": "SELECT v FROM pt WHERE k = :k;",
    "scan": "SELECT count(*) FROM pt WHERE v LIKE '%' || :k || '%';",
    "exprs": "SELECT :k / 2, :k::numeric * 1.5, md5(:k::text);",
}
SERVING_QUERIES = {"hscan": "SELECT count(*) FROM ht WHERE v LIKE '%' || :k || '%';"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--serving-store", choices=("duckdb", "postgres"), default="postgres")
    args = parser.parse_args()
    store_url = new_store_database("bench")
    with tempfile.TemporaryDirectory(prefix="headrace-bench-") as workdir_name:
        workdir = Path(workdir_name)
        server = HeadraceProcess(workdir / "data", ["--store", store_url, "--serving-store", args.serving_store])
        server.start()
        try:
            with psycopg.connect(server.dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE pt (k serial PRIMARY KEY, v text NOT NULL)")
                conn.execute(f"INSERT INTO pt (v) SELECT md5(i::text) FROM generate_series(1, {ROWS}) AS i")
                conn.execute("ANALYZE pt")
                queries = dict(QUERIES)
                if args.serving_store == "postgres":
                    conn.execute("CREATE TABLE ht (k int PRIMARY KEY, v text NOT NULL)")
                    conn.execute(f"INSERT INTO ht SELECT i, md5(i::text) FROM generate_series(1, {ROWS}) AS i")
                    wait_for(lambda: visible(conn, "ht") == ROWS, 600, interval=1, message=f"{ROWS} rows in ht")
                    queries.update(SERVING_QUERIES)
            # the direct peer: the store itself, as the same role headrace's session runs as there
            direct = make_conninfo("", **{**conninfo_to_dict(store_url), "user": "headrace"})
            print(f"store passthrough: pgbench -c {args.clients} -j 1 -T {args.seconds}, {ROWS} rows in the store",
                  flush=True)
            results: dict[str, dict[str, float]] = {}
            for name, script in queries.items():
                for mode in ("simple", "extended"):
                    through, failed_through = pgbench(server.dsn, script, mode, args.seconds, args.clients, workdir)
                    straight, failed_straight = pgbench(direct, script, mode, args.seconds, args.clients, workdir)
                    results[f"{name} {mode}"] = {"headrace": through, "store": straight}
                    print(f"  {name:6} -M {mode:8} headrace {through:9,.0f} tps ({failed_through} failed)   "
                          f"store directly {straight:9,.0f} tps ({failed_straight} failed)   "
                          f"ratio {through / straight:6.1%}", flush=True)
        finally:
            server.stop()


def visible(conn: psycopg.Connection, table: str) -> int:
    try:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
    except psycopg.errors.CannotConnectNow:  # the pipeline has not applied it yet (read-your-writes waits 60 s)
        return -1


if __name__ == "__main__":
    main()
