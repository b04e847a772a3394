"""The two servers compared: a throwaway PostgreSQL 15 cluster and a real `headrace up`, each on free ports with
temporary directories, started together and stopped together (headrace killed with its JVM if it does not stop)."""

from __future__ import annotations

from contextlib import contextmanager
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.server_process import HeadraceProcess
from tests.real_servers.postgres import PostgresCluster

DATABASE = "regression"  # pg_regress's database name

# pg_regress runs every test with these (pg_regress.c: PGTZ, PGDATESTYLE and the database's settings); a session of
# the harness sets them first on both servers, and the report says where headrace refused one.
SESSION_SETTINGS = (
    "SET TimeZone = 'PST8PDT'",
    "SET DateStyle = 'Postgres, MDY'",
    "SET IntervalStyle = 'postgres'",
    "SET bytea_output = 'hex'",
)
# the servers' own defaults, but the same time zone on both (PostgreSQL's comes from the machine at initdb)
DEFAULT_SETTINGS = ("SET TimeZone = 'UTC'",)


@dataclass(frozen=True)
class Servers:
    postgres_dsn: str
    headrace_dsn: str
    headrace: HeadraceProcess
    settings: tuple[str, ...] = SESSION_SETTINGS  # run first in every session on both servers


@contextmanager
def running_servers(workdir: Path, settings: tuple[str, ...] = SESSION_SETTINGS) -> Iterator[Servers]:
    workdir.mkdir(parents=True, exist_ok=True)
    with PostgresCluster(workdir / "postgres", settings={"fsync": "off"}) as cluster:
        dsn = cluster.create_database(DATABASE)
        headrace = HeadraceProcess(workdir / "headrace" / "data")
        headrace.data_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            headrace.start(timeout=120.0)
            yield Servers(postgres_dsn=dsn, headrace_dsn=headrace.dsn, headrace=headrace, settings=settings)
        finally:
            headrace.stop()
