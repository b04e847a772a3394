"""`headrace up` with no --store: the embedded store PostgreSQL end to end. psql connects and runs SELECT 1; after a
kill -9 of headrace (the postmaster runs on, detached) the next start reuses it and serves; a clean stop stops it."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from headrace.store.postgres_cluster import postmaster_pid
from headrace.store.postgres_server import EMBEDDED_ADMIN_ROLE, _socket_directory
from tests.e2e.server_process import HeadraceProcess

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed (scripts/bootstrap.sh)")]


def _psql_select_1(server: HeadraceProcess) -> str:
    ran = subprocess.run(["psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p",
                          str(server.pg_port), "-U", "headrace", "-d", "headrace", "-c", "SELECT 1"],
                         capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.strip()


def _admin_conninfo(server: HeadraceProcess) -> str:
    # <data>/postgres/run, or a directory in /tmp when that path is too long for a socket (pytest-xdist's are)
    return f"host={_socket_directory(server.data_dir / 'postgres')} port=5432 dbname=headrace user={EMBEDDED_ADMIN_ROLE}"


def test_headrace_up_runs_its_own_store(tmp_path: Path) -> None:
    server = HeadraceProcess(tmp_path / "data", embedded_store=True)
    try:
        began = time.monotonic()
        server.start()
        first_start_s = time.monotonic() - began
        assert _psql_select_1(server) == "1"
        postmaster = postmaster_pid(server.store_datadir)
        assert postmaster is not None
        assert "--store" not in " ".join(server.extra_args)
        assert "store:    PostgreSQL 15, embedded" in server.output()
        # headrace's roles are mirrored at start, none of them a PostgreSQL superuser.
        with psycopg.connect(_admin_conninfo(server), autocommit=True) as conn:
            row = conn.execute("SELECT rolsuper, rolcanlogin FROM pg_roles WHERE rolname = 'headrace'").fetchone()
        assert row == (False, True)

        server.kill9()
        assert postmaster_pid(server.store_datadir) == postmaster  # detached from headrace: it runs on
        began = time.monotonic()
        server.start()
        restart_s = time.monotonic() - began
        assert _psql_select_1(server) == "1"
        assert postmaster_pid(server.store_datadir) == postmaster  # reused, not restarted
        print(f"headrace up, embedded store: serving {first_start_s:.1f} s after a first start, "
              f"{restart_s:.1f} s after a restart following kill -9")

        server.stop()  # SIGTERM: headrace stops its store last
        assert postmaster_pid(server.store_datadir) is None
        assert "received fast shutdown request" in (server.data_dir / "postgres" / "server.log").read_text()
    finally:
        server.stop()
