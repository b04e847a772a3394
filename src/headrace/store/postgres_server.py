"""The store PostgreSQL: a private cluster headrace runs itself (embedded, the default) or an existing server given by
URL (external, `headrace up --store postgresql://...`). See docs/store.md.

    store = PostgresStore.open(data_dir)               # embedded: initdb on first start, pg_ctl start, supervised
    store = PostgresStore.open(data_dir, "postgresql://admin@db.example/headrace")   # external
    psycopg.connect(store.admin_conninfo)              # headrace's own DDL and writes
    store.ensure_role("alice", superuser=False)        # a mirrored login role, never a PostgreSQL superuser
    psycopg.connect(store.conninfo_for("alice"))       # a session's backend connection, as alice
    store.stop()

The embedded cluster lives in `<data_dir>/postgres`: `data/` (PGDATA), `server.log`, `run/` (its Unix socket). It has
no TCP listener (listen_addresses = ''); its socket is in a directory of mode 0700 owned by the server's account and
the socket itself is 0700, so only that account and root reach it; pg_hba.conf trusts that socket and nothing else.
As root the cluster runs as the `postgres` account (store/postgres_cluster.py).

A kill -9 of headrace leaves the postmaster running (pg_ctl detaches it). The next start reuses it when it answers on
its socket with the settings this start wants, else stops it (fast, then immediate) and starts afresh: the cluster
is headrace's alone, so whatever runs on it is a previous headrace's.

`start()` blocks (about 1 s for initdb on the first start, 0.1-0.3 s for pg_ctl start after); the server runs it in
a thread while the rest of headrace and the Spark pipeline start, and `wait_ready()` waits for it."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from pathlib import Path

import psycopg
from psycopg import errors, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from headrace.store.postgres_cluster import (ClusterCommandFailed, PostgresNotInstalled, find_bindir, give_to_account,
                                             give_private_directory_in_shared_place, initdb, log_tail, make_reachable,
                                             pg_ctl_start, pg_ctl_stop, postmaster_pid, server_account,
                                             write_as_account)
from headrace.store.postgres_roles import PASSWORDS_FILE, RoleMirror, RoleMirrorError, RolePasswords, login_conninfo

__all__ = ["PostgresStore", "StoreUnavailable", "RoleMirrorError", "EMBEDDED_ADMIN_ROLE", "STORE_DATABASE"]

log = logging.getLogger("headrace.store.postgres")

EMBEDDED_ADMIN_ROLE = "headrace_store_admin"  # the cluster's bootstrap superuser: headrace's own, never a session's
STORE_DATABASE = "headrace"  # the cluster's `postgres` database stays PostgreSQL's
SOCKET_PORT = 5432  # names the socket file only: there is no TCP listener
SHARED_BUFFERS = "128MB"
CONNECTIONS_BEYOND_SESSIONS = 20  # headrace's own connections (DDL, the serving driver) beside one per session
SUPERVISOR_POLL_S = 1.0
SUPERVISOR_BACKOFF_MAX_S = 30.0
FAST_STOP_TIMEOUT_S = 20
_SOCKET_PATH_MAX = 100  # sun_path holds 107 bytes; the socket file adds "/.s.PGSQL.5432"


class StoreUnavailable(Exception):
    """The store PostgreSQL cannot be used: not installed, did not start, or its URL does not connect."""


class _EmbeddedCluster:
    """The private cluster: created, started, reused after a crash, supervised and stopped."""

    def __init__(self, root: Path, *, max_connections: int) -> None:
        self.root = root
        self.datadir = root / "data"
        self.log_file = root / "server.log"
        self.account = server_account()
        self.bindir = find_bindir()
        self.socket_dir = _socket_directory(root)
        self.settings = {
            "listen_addresses": "", "port": str(SOCKET_PORT), "unix_socket_directories": str(self.socket_dir),
            "unix_socket_permissions": "0700", "fsync": "on", "shared_buffers": SHARED_BUFFERS,
            "max_connections": str(max_connections)}
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None

    def conninfo(self, user: str, database: str = STORE_DATABASE) -> str:
        return make_conninfo(host=str(self.socket_dir), port=str(SOCKET_PORT), dbname=database, user=user)

    def start(self) -> None:
        self._prepare_directories()
        if not (self.datadir / "PG_VERSION").exists():
            initdb(self.bindir, self.datadir, superuser=EMBEDDED_ADMIN_ROLE, account=self.account)
            # Trust on the private socket only: no `host` lines (and no TCP listener).
            write_as_account(self.datadir / "pg_hba.conf", "local all all trust\n", self.account)
        if postmaster_pid(self.datadir) is not None and not self._reuse_running():
            self._stop_server()
        if postmaster_pid(self.datadir) is None:
            self._start_server()
        self._ensure_store_database()
        self._supervisor = threading.Thread(target=self._supervise, name="headrace-store-supervisor", daemon=True)
        self._supervisor.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=70)  # a restart in flight ends within pg_ctl's own timeout
        self._stop_server()

    def _prepare_directories(self) -> None:
        self.root.parent.mkdir(parents=True, exist_ok=True)  # the data directory
        changed = make_reachable(self.root, self.account)
        if changed:
            log.warning("made %s traversable (search permission only) for the %s account that runs the store "
                        "PostgreSQL", ", ".join(map(str, changed)), self.account)
        give_to_account(self.root, self.account)
        if self.socket_dir.parent == self.root.resolve():
            give_to_account(self.socket_dir, self.account)
        else:  # the /tmp fallback for a long data directory path
            give_private_directory_in_shared_place(self.socket_dir, self.account)

    def _reuse_running(self) -> bool:
        """A postmaster left running by a headrace that was killed: reuse it if it answers with our settings."""
        try:
            with psycopg.connect(self.conninfo(EMBEDDED_ADMIN_ROLE, "postgres"), connect_timeout=5) as conn:
                running = {name: str(conn.execute("SELECT current_setting(%s)", (name,)).fetchone()[0])  # type: ignore[index]
                           for name in self.settings}
        except psycopg.Error as exc:
            log.warning("the store PostgreSQL left running does not answer (%s): restarting it", exc)
            return False
        if running != self.settings:
            log.warning("the store PostgreSQL left running has other settings: restarting it")
            return False
        log.warning("reusing the store PostgreSQL left running (pid %s)", postmaster_pid(self.datadir))
        return True

    def _start_server(self) -> None:
        started = pg_ctl_start(self.bindir, self.datadir, account=self.account, log_file=self.log_file,
                               settings=self.settings)
        if started.returncode != 0:
            raise ClusterCommandFailed(f"pg_ctl start failed: {started.stderr.strip()}\n"
                                       f"{log_tail(self.log_file)}")

    def _stop_server(self) -> None:
        if postmaster_pid(self.datadir) is None:
            return
        if not pg_ctl_stop(self.bindir, self.datadir, account=self.account, mode="fast",
                           timeout_s=FAST_STOP_TIMEOUT_S):
            log.warning("the store PostgreSQL did not stop within %d s: stopping it immediately", FAST_STOP_TIMEOUT_S)
            pg_ctl_stop(self.bindir, self.datadir, account=self.account, mode="immediate")

    def _ensure_store_database(self) -> None:
        with psycopg.connect(self.conninfo(EMBEDDED_ADMIN_ROLE, "postgres"), autocommit=True,
                             connect_timeout=10) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (STORE_DATABASE,)).fetchone():
                return
            try:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(STORE_DATABASE)))
            except errors.DuplicateDatabase:
                pass

    def _supervise(self) -> None:
        """Poll the postmaster; if it died, start it again, with backoff while starting fails."""
        failures = 0
        while not self._stopping.wait(SUPERVISOR_POLL_S):
            if postmaster_pid(self.datadir) is not None:
                failures = 0
                continue
            log.error("the store PostgreSQL is not running: restarting it")
            try:
                self._start_server()
                log.warning("the store PostgreSQL is running again (pid %s)", postmaster_pid(self.datadir))
                failures = 0
            except ClusterCommandFailed as exc:
                # e.g. the killed postmaster's backends still hold its shared memory for a moment
                failures += 1
                delay = min(SUPERVISOR_BACKOFF_MAX_S, 0.25 * 2 ** failures)
                log.error("restarting the store PostgreSQL failed (retrying in %.1f s): %s", delay, exc)
                self._stopping.wait(delay)


def _socket_directory(root: Path) -> Path:
    """`<root>/run`, unless its socket path would be too long for a Unix socket: then a directory in /tmp named
    after the cluster (the same one at every start)."""
    preferred = root.resolve() / "run"
    if len(f"{preferred}/.s.PGSQL.{SOCKET_PORT}".encode()) <= _SOCKET_PATH_MAX:
        return preferred
    digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    return Path("/tmp") / f"headrace-pg-{digest}"


class PostgresStore:
    """The store PostgreSQL: embedded (private cluster) or external (a URL)."""

    def __init__(self, data_dir: Path, url: str | None, *, max_connections: int) -> None:
        """Checks what can be checked at once (the binaries, the URL's form) and starts nothing: see `start`."""
        self.data_dir = data_dir
        self.url = url
        self._ready = threading.Event()
        self.started_in_s: float | None = None  # how long `start` took (initdb, pg_ctl start, or the URL's check)
        self._failure: BaseException | None = None
        self._embedded: _EmbeddedCluster | None = None
        self._passwords: RolePasswords | None = None
        try:
            if url is None:
                self._embedded = _EmbeddedCluster(data_dir / "postgres",
                                                  max_connections=max_connections + CONNECTIONS_BEYOND_SESSIONS)
                self.admin_role = EMBEDDED_ADMIN_ROLE
                self.database = STORE_DATABASE
                self.admin_conninfo = self._embedded.conninfo(EMBEDDED_ADMIN_ROLE)
            else:
                parameters = conninfo_to_dict(url)
                self.admin_role = str(parameters.get("user") or os.environ.get("PGUSER") or _login_name())
                self.database = str(parameters.get("dbname") or os.environ.get("PGDATABASE") or self.admin_role)
                self.admin_conninfo = url
                self._passwords = RolePasswords(data_dir / PASSWORDS_FILE)
        except (PostgresNotInstalled, ClusterCommandFailed) as exc:
            raise StoreUnavailable(str(exc)) from None
        except psycopg.ProgrammingError as exc:  # conninfo_to_dict: not a conninfo or URL
            raise StoreUnavailable(f"--store: not a PostgreSQL URL: {exc}") from None
        self._roles = RoleMirror(self.admin_conninfo, self.admin_role, self.database, self._passwords)

    @classmethod
    def open(cls, data_dir: Path, url: str | None = None, *, max_connections: int = 100) -> PostgresStore:
        """Configure and start: returns once the store answers. `max_connections`: headrace's own limit of SQL
        sessions (the embedded cluster allows that many more than headrace's own connections)."""
        store = cls(data_dir, url, max_connections=max_connections)
        store.start()
        return store

    @property
    def embedded(self) -> bool:
        return self._embedded is not None

    @property
    def log_file(self) -> Path | None:
        return self._embedded.log_file if self._embedded is not None else None

    @property
    def display_location(self) -> str:
        """Where the store is, for people: the external URL's host, port and database (never its credentials)."""
        if self._embedded is not None:
            return str(self._embedded.datadir)
        parameters = conninfo_to_dict(self.admin_conninfo)
        return f"{parameters.get('host', 'localhost')}:{parameters.get('port', '5432')}/{self.database}"

    @property
    def postmaster_pid(self) -> int | None:
        """The embedded cluster's postmaster, if it runs (None for an external store)."""
        return postmaster_pid(self._embedded.datadir) if self._embedded is not None else None

    def start(self) -> None:
        """Blocking: the embedded cluster is created if need be and running, or the external URL connected and
        checked. Raises StoreUnavailable (and `wait_ready` raises it too)."""
        began = time.monotonic()
        try:
            if self._embedded is not None:
                self._embedded.start()
            else:
                self._check_external()
        except StoreUnavailable as exc:
            self._failure = exc
            self._ready.set()
            raise
        except (ClusterCommandFailed, PostgresNotInstalled, psycopg.Error, OSError) as exc:
            self._failure = StoreUnavailable(f"the store PostgreSQL is unavailable: {exc}")
            self._ready.set()
            raise self._failure from None
        self.started_in_s = time.monotonic() - began
        log.info("store PostgreSQL ready in %.2f s", self.started_in_s)
        self._ready.set()

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        if not self._ready.wait(timeout_s):
            raise StoreUnavailable(f"the store PostgreSQL did not start within {timeout_s:.0f} s")
        if self._failure is not None:
            raise self._failure

    def conninfo_for(self, role: str) -> str:
        """A conninfo that logs in as `role` (mirrored first by `ensure_role`), never with the admin's credentials."""
        if self._embedded is not None:
            return self._embedded.conninfo(role)
        return login_conninfo(self.admin_conninfo, role, self._roles.password_of(role))

    def ensure_role(self, role: str, *, superuser: bool, recheck: bool = False) -> None:
        """Mirror `role` as a login role that is never a PostgreSQL superuser (store/postgres_roles.py); idempotent,
        free once done in this process unless `recheck` (after a login as `role` failed: it may have been dropped
        behind this process's back). Blocking: call it off the event loop. Raises RoleMirrorError for the admin role's name or a role of someone
        else's, StoreUnavailable while the store is not running, psycopg.Error for anything the server refuses."""
        self.wait_ready()
        try:
            self._roles.ensure(role, superuser=superuser, recheck=recheck)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"the store PostgreSQL is unavailable: {exc}") from None

    def drop_role(self, role: str) -> None:
        """DROP ROLE of a mirrored role, its objects in the store database reassigned to the admin role first."""
        self.wait_ready()
        try:
            self._roles.drop(role)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"the store PostgreSQL is unavailable: {exc}") from None

    def stop(self) -> None:
        """Embedded: the supervisor ends, then pg_ctl stop -m fast (immediate after 20 s). External: nothing."""
        if self._embedded is not None:
            self._embedded.stop()

    def _check_external(self) -> None:
        """The URL connects, and its role may create roles and own what headrace creates (docs/store.md)."""
        with psycopg.connect(self.admin_conninfo, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT current_user, current_database(), rolsuper, rolcreaterole, "
                "pg_get_userbyid(d.datdba) = current_user OR rolsuper, current_setting('server_version_num')::int "
                "FROM pg_roles r, pg_database d WHERE r.rolname = current_user AND d.datname = current_database()"
            ).fetchone()
        assert row is not None
        user, database, superuser, createrole, owns_database, version = row
        self.admin_role, self.database = str(user), str(database)
        self._roles = RoleMirror(self.admin_conninfo, self.admin_role, self.database, self._passwords)
        if not (superuser or createrole) or not owns_database:
            raise StoreUnavailable(
                f'--store: role "{user}" must have CREATEROLE and own database "{database}" (it mirrors headrace\'s '
                "roles and grants them CREATE there; docs/store.md)")
        if int(version) // 10000 < 15:  # type: ignore[call-overload]
            raise StoreUnavailable(f"--store: PostgreSQL {int(version) // 10000} is older than 15")  # type: ignore[call-overload]


def _login_name() -> str:
    import getpass

    return getpass.getuser()
