"""The store PostgreSQL (store/postgres_server.py) against real PostgreSQL 15 servers: the embedded cluster's life
(first start, restart, reuse after its headrace was killed, the supervisor bringing back a killed postmaster), the
mirrored roles (never superusers), and an external server whose role is not a superuser."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import errors

from headrace.store.postgres_cluster import postmaster_pid
from headrace.store.postgres_roles import SUBSCRIBE_READER_ROLE, TABLE_WRITES_ROLE
from headrace.store.postgres_server import (EMBEDDED_ADMIN_ROLE, STORE_DATABASE, PostgresStore, RoleMirrorError,
                                            StoreUnavailable, _socket_directory)
from tests.real_servers.postgres import PostgresCluster

SRC = Path(__file__).resolve().parents[2] / "src"


def _one(conninfo: str, query: str, params: tuple[object, ...] = ()) -> object:
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def _wait_until_answers(conninfo: str, timeout_s: float) -> float:
    began = time.monotonic()
    while True:
        try:
            _one(conninfo, "SELECT 1")
            return time.monotonic() - began
        except psycopg.OperationalError:
            if time.monotonic() - began > timeout_s:
                raise
            time.sleep(0.1)


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresStore]:
    store = PostgresStore.open(tmp_path_factory.mktemp("embedded"))
    yield store
    store.stop()


def test_embedded_cluster_is_private(embedded: PostgresStore) -> None:
    assert embedded.embedded
    admin = embedded.admin_conninfo
    assert _one(admin, "SELECT current_database()") == STORE_DATABASE
    assert _one(admin, "SELECT current_user") == EMBEDDED_ADMIN_ROLE
    assert str(_one(admin, "SHOW server_version")).startswith("15.")
    assert _one(admin, "SHOW listen_addresses") == ""  # no TCP listener at all
    assert _one(admin, "SHOW unix_socket_permissions") == "0700"
    assert _one(admin, "SHOW fsync") == "on"
    assert _one(admin, "SHOW server_encoding") == "UTF8"
    assert _one(admin, "SELECT count(*) FROM pg_hba_file_rules WHERE type <> 'local'") == 0
    root = embedded.data_dir / "postgres"
    for directory in (root, _socket_directory(root), root / "data"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    assert (root / "server.log").exists()
    assert os.path.exists(_socket_directory(root) / ".s.PGSQL.5432")


def test_restart_reuses_the_cluster_and_its_data(tmp_path: Path) -> None:
    began = time.monotonic()
    store = PostgresStore.open(tmp_path)
    first_start_s = time.monotonic() - began
    with psycopg.connect(store.admin_conninfo, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (n int)")
        conn.execute("INSERT INTO kept VALUES (7)")
    store.stop()
    assert store.postmaster_pid is None

    began = time.monotonic()
    again = PostgresStore.open(tmp_path)
    restart_s = time.monotonic() - began
    try:
        assert _one(again.admin_conninfo, "SELECT n FROM kept") == 7
    finally:
        again.stop()
    print(f"embedded store: first start {first_start_s:.2f} s, restart {restart_s:.2f} s")
    assert restart_s < first_start_s  # no initdb the second time


_OPEN_AND_HANG = """
import sys, time
from pathlib import Path
from headrace.store.postgres_server import PostgresStore
store = PostgresStore.open(Path(sys.argv[1]))
print(store.postmaster_pid, flush=True)
time.sleep(600)
"""


def test_a_postmaster_left_running_by_a_killed_headrace_is_reused(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", _OPEN_AND_HANG, str(tmp_path)], stdout=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": str(SRC)}, text=True)
    assert owner.stdout is not None
    orphan_pid = int(owner.stdout.readline())
    owner.kill()  # kill -9: no stop, the postmaster runs on
    owner.wait()
    assert postmaster_pid(tmp_path / "postgres" / "data") == orphan_pid

    store = PostgresStore.open(tmp_path)
    try:
        assert store.postmaster_pid == orphan_pid
        assert _one(store.admin_conninfo, "SELECT 1") == 1
    finally:
        store.stop()
    # Left running with other settings (here --max-connections changed): stopped and started afresh.
    owner = subprocess.Popen([sys.executable, "-c", _OPEN_AND_HANG, str(tmp_path)], stdout=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": str(SRC)}, text=True)
    assert owner.stdout is not None
    orphan_pid = int(owner.stdout.readline())
    owner.kill()
    owner.wait()
    store = PostgresStore.open(tmp_path, max_connections=30)
    try:
        assert store.postmaster_pid not in (None, orphan_pid)
        assert _one(store.admin_conninfo, "SHOW max_connections") == "50"
    finally:
        store.stop()


def test_supervisor_restarts_a_killed_postmaster(tmp_path: Path) -> None:
    store = PostgresStore.open(tmp_path)
    try:
        killed = store.postmaster_pid
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        back_after_s = _wait_until_answers(store.admin_conninfo, timeout_s=30)
        assert store.postmaster_pid not in (None, killed)
        print(f"embedded store: back {back_after_s:.2f} s after a kill -9 of its postmaster")
        store.ensure_role("after_restart", superuser=False)
        assert _one(store.conninfo_for("after_restart"), "SELECT current_user") == "after_restart"
    finally:
        store.stop()
    assert store.postmaster_pid is None  # the supervisor ended first: nothing brought it back


def _refuses_server_side_files(conninfo: str) -> None:
    """What a PostgreSQL superuser could do and a headrace user must not, whatever its headrace role."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for statement in ("COPY (SELECT 1) TO PROGRAM 'true'", "SELECT pg_read_file('/etc/passwd')",
                          "COPY (SELECT 1) TO '/tmp/headrace-should-not-exist'"):
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(statement)


def test_mirrored_roles_are_never_superusers(embedded: PostgresStore) -> None:
    embedded.ensure_role("plain_user", superuser=False)
    embedded.ensure_role("plain_user", superuser=False)  # idempotent
    embedded.ensure_role("headrace_super", superuser=True)
    fresh = PostgresStore.open(embedded.data_dir)  # no memory of what was mirrored: checks the server again
    try:
        fresh.ensure_role("headrace_super", superuser=True)
    finally:
        fresh._embedded._stopping.set()  # type: ignore[union-attr]  # share the cluster: end its supervisor only
    for role in ("plain_user", "headrace_super"):
        conninfo = embedded.conninfo_for(role)
        assert EMBEDDED_ADMIN_ROLE not in conninfo
        assert _one(conninfo, "SELECT current_user") == role
        assert _one(conninfo, "SELECT rolsuper OR rolcreaterole OR rolcreatedb OR rolbypassrls OR rolreplication "
                              "FROM pg_roles WHERE rolname = current_user") is False
        _refuses_server_side_files(conninfo)
    with psycopg.connect(embedded.conninfo_for("headrace_super"), autocommit=True) as conn:
        conn.execute("CREATE TABLE made_by_super (n int)")
        conn.execute("CREATE TEMP TABLE scratch (n int)")
    with psycopg.connect(embedded.conninfo_for("plain_user"), autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE scratch (n int)")  # TEMP for everyone
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE not_allowed (n int)")


def test_a_superuser_of_the_same_name_is_locked_down(embedded: PostgresStore) -> None:
    with psycopg.connect(embedded.admin_conninfo, autocommit=True) as conn:
        conn.execute('CREATE ROLE "made_super" SUPERUSER LOGIN CREATEROLE')
    embedded.ensure_role("made_super", superuser=True)
    assert _one(embedded.admin_conninfo, "SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = %s",
                ("made_super",)) is False
    _refuses_server_side_files(embedded.conninfo_for("made_super"))


def test_demoted_superuser_loses_create(embedded: PostgresStore) -> None:
    embedded.ensure_role("demoted", superuser=True)
    member = "SELECT pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER')"
    assert _one(embedded.conninfo_for("demoted"), member) is True  # every session's query, as a superuser's
    embedded.ensure_role("demoted", superuser=False)
    assert _one(embedded.conninfo_for("demoted"), member) is False
    with psycopg.connect(embedded.conninfo_for("demoted"), autocommit=True) as conn:
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE not_any_more (n int)")


def test_the_admin_role_is_never_mirrored(embedded: PostgresStore) -> None:
    with pytest.raises(RoleMirrorError) as refused:
        embedded.ensure_role(EMBEDDED_ADMIN_ROLE, superuser=False)
    assert refused.value.sqlstate == "42939"
    with pytest.raises(RoleMirrorError) as reserved:  # SUBSCRIBE's reader on the PostgreSQL serving store
        embedded.ensure_role(SUBSCRIBE_READER_ROLE, superuser=False)
    assert reserved.value.sqlstate == "42939"
    with pytest.raises(RoleMirrorError) as writes:  # table writes' queries on the PostgreSQL serving store
        embedded.ensure_role(TABLE_WRITES_ROLE, superuser=False)
    assert writes.value.sqlstate == "42939"


def test_concurrent_ensure_of_one_role(embedded: PostgresStore) -> None:
    """Two stores (two caches, two locks) mirror the same new role at once: both succeed."""
    other = PostgresStore.open(embedded.data_dir)
    other._embedded._stopping.set()  # type: ignore[union-attr]
    failures: list[BaseException] = []

    def mirror(store: PostgresStore) -> None:
        try:
            store.ensure_role("raced", superuser=False)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            failures.append(exc)

    threads = [threading.Thread(target=mirror, args=(store,)) for store in (embedded, other, embedded, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert _one(embedded.conninfo_for("raced"), "SELECT current_user") == "raced"


def test_drop_role_reassigns_what_it_owns(embedded: PostgresStore) -> None:
    embedded.ensure_role("leaver", superuser=True)
    with psycopg.connect(embedded.conninfo_for("leaver"), autocommit=True) as conn:
        conn.execute("CREATE TABLE left_behind (n int)")
    embedded.drop_role("leaver")
    embedded.drop_role("leaver")  # gone already: nothing to do
    assert _one(embedded.admin_conninfo, "SELECT count(*) FROM pg_roles WHERE rolname = 'leaver'") == 0
    assert _one(embedded.admin_conninfo, "SELECT tableowner FROM pg_tables WHERE tablename = 'left_behind'") \
        == EMBEDDED_ADMIN_ROLE
    embedded.ensure_role("leaver", superuser=False)  # mirrored again after its drop, not remembered as mirrored
    assert _one(embedded.conninfo_for("leaver"), "SELECT current_user") == "leaver"
    with psycopg.connect(embedded.admin_conninfo, autocommit=True) as conn:
        conn.execute("DROP OWNED BY leaver")  # behind the store's back
        conn.execute("DROP ROLE leaver")
    embedded.ensure_role("leaver", superuser=False)  # remembered: nothing done
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(embedded.conninfo_for("leaver"), connect_timeout=5)
    embedded.ensure_role("leaver", superuser=False, recheck=True)
    assert _one(embedded.conninfo_for("leaver"), "SELECT current_user") == "leaver"


def test_a_long_data_dir_puts_the_socket_in_tmp(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    socket_dir = _socket_directory(deep / "postgres")
    assert socket_dir.parent == Path("/tmp")
    assert socket_dir == _socket_directory(deep / "postgres")  # the same at every start
    assert _socket_directory(tmp_path / "postgres") == (tmp_path / "postgres").resolve() / "run"
    store = PostgresStore.open(deep)
    try:
        assert _one(store.admin_conninfo, "SHOW unix_socket_directories") == str(socket_dir)
        assert stat.S_IMODE(socket_dir.stat().st_mode) == 0o700
    finally:
        store.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)


def test_a_planted_socket_directory_in_tmp_is_refused(tmp_path: Path) -> None:
    """Someone else's symlink at the /tmp fallback path must not steer where the socket goes (or a chown as root)."""
    deep = tmp_path / ("f" * 60) / ("g" * 60)
    socket_dir = _socket_directory(deep / "postgres")
    target = tmp_path / "elsewhere"
    target.mkdir()
    socket_dir.symlink_to(target)
    try:
        with pytest.raises(StoreUnavailable, match="is not headrace's"):
            PostgresStore.open(deep)
        assert target.stat().st_uid == os.geteuid()
    finally:
        socket_dir.unlink()


# --- external ---------------------------------------------------------------------------------------------------


def _superuser_over_socket(cluster: PostgresCluster) -> str:
    return f"host={cluster.datadir} port={cluster.port} user=postgres dbname=postgres"


@pytest.fixture(scope="module")
def external_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresCluster]:
    """A separate PostgreSQL where TCP logins need a password (SCRAM), so mirrored roles log in by theirs."""
    with PostgresCluster(tmp_path_factory.mktemp("external")) as cluster:
        with psycopg.connect(cluster.dsn, autocommit=True) as conn:
            conn.execute("CREATE ROLE store_admin LOGIN CREATEROLE PASSWORD 'admin-secret'")
            conn.execute("CREATE ROLE no_createrole LOGIN PASSWORD 'other-secret'")
            conn.execute("CREATE DATABASE ext_store OWNER store_admin")
            conn.execute("CREATE DATABASE not_owned")
        (cluster.datadir / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n")
        with psycopg.connect(_superuser_over_socket(cluster), autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
        yield cluster


def test_external_store_with_a_createrole_admin(external_cluster: PostgresCluster, tmp_path: Path) -> None:
    url = f"postgresql://store_admin:admin-secret@127.0.0.1:{external_cluster.port}/ext_store"
    store = PostgresStore.open(tmp_path, url)
    assert not store.embedded and store.postmaster_pid is None
    assert store.display_location == f"127.0.0.1:{external_cluster.port}/ext_store"
    store.ensure_role("alice", superuser=False)
    store.ensure_role("boss", superuser=True)
    alice = store.conninfo_for("alice")
    assert "admin-secret" not in alice and "store_admin" not in alice
    assert _one(alice, "SELECT current_user || '@' || current_database()") == "alice@ext_store"
    _refuses_server_side_files(alice)
    _refuses_server_side_files(store.conninfo_for("boss"))
    with psycopg.connect(store.conninfo_for("boss"), autocommit=True) as conn:
        conn.execute("CREATE TABLE boss_table (n int)")
        # a CREATEROLE admin can make it a pg_read_all_stats member (PostgreSQL 15)
        assert conn.execute("SELECT pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER')").fetchone() == (True,)
    passwords = tmp_path / "store_roles.json"
    assert stat.S_IMODE(passwords.stat().st_mode) == 0o600
    # The password file is all that lets a mirrored role in: its password is no one else's.
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(alice.replace(store._roles.password_of("alice") or "", "wrong"), connect_timeout=5)

    # Restarted with the same data directory: the passwords kept, no role made again.
    again = PostgresStore.open(tmp_path, url)
    again.ensure_role("alice", superuser=False)
    assert _one(again.conninfo_for("alice"), "SELECT current_user") == "alice"

    store.drop_role("boss")  # as a CREATEROLE admin that is not a superuser
    assert _one(url, "SELECT tableowner FROM pg_tables WHERE tablename = 'boss_table'") == "store_admin"
    assert _one(url, "SELECT count(*) FROM pg_roles WHERE rolname = 'boss'") == 0


def test_external_store_refuses_a_role_it_did_not_create(external_cluster: PostgresCluster, tmp_path: Path) -> None:
    with psycopg.connect(_superuser_over_socket(external_cluster), autocommit=True) as conn:
        conn.execute("CREATE ROLE someone_elses LOGIN")
    store = PostgresStore.open(tmp_path, f"postgresql://store_admin:admin-secret@127.0.0.1:{external_cluster.port}"
                                         "/ext_store")
    with pytest.raises(RoleMirrorError) as refused:
        store.ensure_role("someone_elses", superuser=False)
    assert refused.value.sqlstate == "42710"
    with pytest.raises(RoleMirrorError):
        store.ensure_role("store_admin", superuser=False)


def test_external_store_needs_createrole_and_the_database(external_cluster: PostgresCluster, tmp_path: Path) -> None:
    port = external_cluster.port
    with pytest.raises(StoreUnavailable, match="CREATEROLE"):
        PostgresStore.open(tmp_path, f"postgresql://no_createrole:other-secret@127.0.0.1:{port}/ext_store")
    with pytest.raises(StoreUnavailable, match="own database"):
        PostgresStore.open(tmp_path, f"postgresql://store_admin:admin-secret@127.0.0.1:{port}/not_owned")
    with pytest.raises(StoreUnavailable, match="unavailable"):
        PostgresStore.open(tmp_path, f"postgresql://store_admin:wrong@127.0.0.1:{port}/ext_store")
    with pytest.raises(StoreUnavailable, match="not a PostgreSQL URL"):
        PostgresStore.open(tmp_path, "postgresql://[not a url")
    failed = PostgresStore(tmp_path, f"postgresql://store_admin:wrong@127.0.0.1:{port}/ext_store",
                           max_connections=10)
    with pytest.raises(StoreUnavailable):
        failed.start()
    with pytest.raises(StoreUnavailable):  # sessions waiting for the store get the reason
        failed.ensure_role("alice", superuser=False)


def test_a_role_login_carries_none_of_the_admins_credentials() -> None:
    from psycopg.conninfo import conninfo_to_dict

    from headrace.store.postgres_roles import login_conninfo

    admin = ("host=db.example port=5433 dbname=hr user=admin password=secret passfile=/root/.pgpass "
             "sslmode=verify-full sslcert=/a.crt sslkey=/a.key options='-c search_path=admin'")
    assert conninfo_to_dict(login_conninfo(admin, "alice", "pw", options="-c TimeZone=UTC")) == {
        "host": "db.example", "port": "5433", "dbname": "hr", "sslmode": "verify-full", "user": "alice",
        "password": "pw", "options": "-c TimeZone=UTC"}
    assert conninfo_to_dict(login_conninfo(admin, "bob", None)) == {
        "host": "db.example", "port": "5433", "dbname": "hr", "sslmode": "verify-full", "user": "bob"}
