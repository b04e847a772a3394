"""A throwaway PostgreSQL 15 cluster for tests and benchmarks (real server, never a mock).

    with PostgresCluster(tmp_path / "pg") as cluster:
        dsn = cluster.create_database("sink_test")

    shared_cluster().create_database("x")   # one cluster per test process, started on first use, gone after it

initdb and pg_ctl run as the embedded store does (headrace/store/postgres_cluster.py): as the `postgres` account when
the tests run as root, the data directory given to it and its parents made traversable. The server listens on
127.0.0.1:<free port> (and a Unix socket in the data directory), trusts local connections and runs with `fsync=on`,
so commits are as durable as in production. `stop()` is `pg_ctl -m immediate` (a crash, as for the benchmarks'
peers: nothing needs to survive)."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import Self

import psycopg

from headrace.store.postgres_cluster import (as_account, find_bindir, give_to_account, initdb, log_tail,
                                             make_reachable, pg_ctl_start, pg_ctl_stop, server_account)

_START_ATTEMPTS = 3  # a free port can be taken between probing and binding it


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresCluster:
    """One PostgreSQL 15 server on a free port, its data in `workdir` (created). A context manager: started on
    enter (or by `start()`), stopped on exit."""

    def __init__(self, workdir: Path, settings: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.datadir = workdir / "data"
        self.settings = {"fsync": "on", "max_connections": "100", **(settings or {})}
        self.port = 0
        self._running = False
        self._bindir = find_bindir()
        self._account = server_account()

    @property
    def dsn(self) -> str:
        return self.dsn_of("postgres")

    def dsn_of(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> Self:
        make_reachable(self.workdir, self._account)
        give_to_account(self.workdir, self._account, mode=0o755)
        if not (self.datadir / "PG_VERSION").exists():
            initdb(self._bindir, self.datadir, superuser="postgres", account=self._account, sync=False)
        log = self.datadir / "server.log"
        for attempt in range(_START_ATTEMPTS):
            self.port = free_port()
            started = pg_ctl_start(self._bindir, self.datadir, account=self._account, log_file=log, settings={
                "port": str(self.port), "unix_socket_directories": str(self.datadir),
                "listen_addresses": "127.0.0.1", **self.settings})
            if started.returncode == 0:
                self._running = True
                return self
            if attempt == _START_ATTEMPTS - 1:
                raise RuntimeError(f"PostgreSQL did not start: {started.stderr}\n{log_tail(log)}")
        raise AssertionError("unreachable")

    def create_database(self, name: str) -> str:
        """Create database `name` (dropping an existing one) and return its DSN."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn_of(name)

    def stop_command(self) -> list[str]:
        """`pg_ctl stop -m immediate` of this cluster, as its account runs it."""
        return as_account(self._account, [str(self._bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "immediate",
                                          "stop"])

    def stop(self) -> None:
        if self._running:
            pg_ctl_stop(self._bindir, self.datadir, account=self._account, mode="immediate")
            self._running = False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


_shared: PostgresCluster | None = None
_shared_lock = threading.Lock()
_database_numbers = itertools.count(1)
_shared_watchdog: subprocess.Popen[bytes] | None = None

# Stops the shared cluster and removes its files once the test process is gone, however it ended (a clean exit, a
# timeout's SIGTERM, kill -9): it waits for the end of its stdin, a pipe only the test process holds.
_WATCHDOG = """
import shutil, subprocess, sys
sys.stdin.buffer.read()
subprocess.run(sys.argv[2:], capture_output=True)
shutil.rmtree(sys.argv[1], ignore_errors=True)
"""


def shared_cluster() -> PostgresCluster:
    """One cluster for every headrace server a test process starts (tests/e2e/server_process.py gives each a fresh
    database in it: ~0.3 s, against ~1.5 s for a cluster of its own). Started on first use; a watchdog process stops
    it and removes its files once the test process has ended, however it ended."""
    global _shared, _shared_watchdog
    with _shared_lock:
        if _shared is None:
            workdir = Path(tempfile.mkdtemp(prefix="headrace-test-store-"))
            # Many servers at once (session- and module-scoped ones), each with a connection per session.
            cluster = PostgresCluster(workdir, settings={"max_connections": "400", "fsync": "off"})
            # Its own session: a signal to the test's process group does not end it before its work is done.
            _shared_watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(workdir), *cluster.stop_command()],
                                                stdin=subprocess.PIPE, start_new_session=True)
            cluster.start()
            _shared = cluster
        return _shared


def new_store_database(prefix: str = "store") -> str:
    """A fresh database in the shared cluster for one headrace server's --store; returns its URL."""
    return shared_cluster().create_database(f"{prefix}_{os.getpid()}_{next(_database_numbers)}")

