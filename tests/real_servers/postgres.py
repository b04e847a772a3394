"""A throwaway PostgreSQL 15 cluster for tests and benchmarks (real server, never a mock).

    with PostgresCluster(tmp_path / "pg") as cluster:
        dsn = cluster.create_database("sink_test")

The server refuses to run as root, so initdb and pg_ctl run as the `postgres` user (`runuser -u postgres --`); the
data directory lives in the given directory, whose parents are made traversable for that user. The server listens
on 127.0.0.1:<free port> (and a Unix socket in the data directory), trusts local connections and runs with
`fsync=on`, so commits are as durable as in production. `stop()` is `pg_ctl -m immediate` (a crash, as for the
benchmarks' peers: nothing needs to survive)."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Self

import psycopg

BINDIR = Path("/usr/lib/postgresql/15/bin")
_AS_POSTGRES = ["runuser", "-u", "postgres", "--"]
_START_ATTEMPTS = 3  # a free port can be taken between probing and binding it


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _make_reachable(directory: Path) -> None:
    """Add search (x) permission for group and others to every parent, so the postgres user reaches its data
    directory (read permission is not needed, nor granted)."""
    for parent in directory.resolve().parents:
        mode = parent.stat().st_mode
        if mode & (stat.S_IXGRP | stat.S_IXOTH) != (stat.S_IXGRP | stat.S_IXOTH):
            os.chmod(parent, stat.S_IMODE(mode) | stat.S_IXGRP | stat.S_IXOTH)


class PostgresCluster:
    """One PostgreSQL 15 server on a free port, its data in `workdir` (created). A context manager: started on
    enter (or by `start()`), stopped on exit."""

    def __init__(self, workdir: Path, settings: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.datadir = workdir / "data"
        self.settings = {"fsync": "on", "max_connections": "100", **(settings or {})}
        self.port = 0
        self._running = False

    @property
    def dsn(self) -> str:
        return self.dsn_of("postgres")

    def dsn_of(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        _make_reachable(self.workdir)
        shutil.chown(self.workdir, "postgres")
        if not (self.datadir / "PG_VERSION").exists():
            subprocess.run([*_AS_POSTGRES, str(BINDIR / "initdb"), "-D", str(self.datadir), "-A", "trust",
                            "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync"],
                           check=True, capture_output=True)
        log = self.datadir / "server.log"
        for attempt in range(_START_ATTEMPTS):
            self.port = free_port()
            options = " ".join([f"-p {self.port}", f"-k {self.datadir}", "-c listen_addresses=127.0.0.1",
                                *(f"-c {name}={value}" for name, value in self.settings.items())])
            started = subprocess.run([*_AS_POSTGRES, str(BINDIR / "pg_ctl"), "-D", str(self.datadir), "-w",
                                      "-t", "60", "-l", str(log), "-o", options, "start"], capture_output=True)
            if started.returncode == 0:
                self._running = True
                return self
            if attempt == _START_ATTEMPTS - 1:
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"PostgreSQL did not start: {started.stderr.decode(errors='replace')}\n{tail}")
        raise AssertionError("unreachable")

    def create_database(self, name: str) -> str:
        """Create database `name` (dropping an existing one) and return its DSN."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn_of(name)

    def stop(self) -> None:
        if self._running:
            subprocess.run([*_AS_POSTGRES, str(BINDIR / "pg_ctl"), "-D", str(self.datadir), "-m", "immediate",
                            "stop"], check=False, capture_output=True)
            self._running = False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
