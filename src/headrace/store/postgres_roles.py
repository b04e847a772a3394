"""headrace's roles mirrored as login roles of the store PostgreSQL, so each SQL session's backend connection runs
as its own user (current_user, ownership and privileges are PostgreSQL's).

A mirrored role is never a PostgreSQL superuser, nor CREATEDB, CREATEROLE, REPLICATION or BYPASSRLS, whatever it is
in headrace: a PostgreSQL superuser could run `COPY ... TO PROGRAM` or `pg_read_file()` and so step around headrace's
own --allow-command / --allow-directory rules. A headrace superuser gets CREATE on the store database and on schema
`public` instead; every role gets CONNECT and TEMP on the store database.

External stores log mirrored roles in with a random password, kept in `<data_dir>/store_roles.json` (mode 0600) and
sent to the server as a SCRAM verifier (the password itself never reaches the server or its logs). A role is marked
with a comment when created; in an external store a role of the same name that lacks the mark belongs to someone
else and is refused rather than taken over. Embedded stores trust their private socket: no passwords."""

from __future__ import annotations

import json
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import errors, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from headrace.catalog.roles import make_scram_verifier
from headrace.durable import replace_file_durably

MIRROR_MARK = "headrace: mirrored role"
PASSWORDS_FILE = "store_roles.json"
MIRROR_LOCK_KEY = 0x6865616472616365  # "headrace": the advisory lock of role mirroring
# The unprivileged role SUBSCRIBE's SELECTs run as (coordinator/subscribe_postgres.py): never a mirrored role.
SUBSCRIBE_READER_ROLE = "headrace_subscribe_reader"
# The role a table write's own query runs as (store/table_reads_postgres.py): never a mirrored role either.
TABLE_WRITES_ROLE = "headrace_table_writes"
_LOCKED_DOWN = sql.SQL("LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS")
# What of the admin's conninfo is the admin's own: never carried into another role's login.
_ADMIN_CREDENTIALS = ("password", "passfile", "sslcert", "sslkey", "sslpassword", "service", "options")


def login_conninfo(admin_conninfo: str, role: str, password: str | None, *, options: str | None = None) -> str:
    """The admin's conninfo (host, port, database, TLS mode) logging in as `role` instead: none of the admin's
    credentials or session options, the role's own password and startup `options` if any."""
    settings = {key: value for key, value in conninfo_to_dict(admin_conninfo).items() if key not in _ADMIN_CREDENTIALS}
    settings["user"] = role
    if password:
        settings["password"] = password
    if options:
        settings["options"] = options
    return make_conninfo(**settings)


class RoleMirrorError(Exception):
    """A role that cannot be mirrored: the store's admin role itself, or a role the store has that headrace did not
    create. `sqlstate` is PostgreSQL's for the nearest case (42939 reserved_name, 42710 duplicate_object)."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class RolePasswords:
    """The passwords of the mirrored roles of an external store, in a file only this account reads."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._passwords: dict[str, str] = {}
        if path.exists():
            self._passwords = dict(json.loads(path.read_text())["passwords"])

    def get(self, role: str) -> str | None:
        return self._passwords.get(role)

    def new(self, role: str) -> str:
        """A fresh password for `role`, durable before it is returned (so it is never set in the store and then
        lost)."""
        password = secrets.token_urlsafe(32)
        self._passwords[role] = password
        self._persist()
        return password

    def forget(self, role: str) -> None:
        if self._passwords.pop(role, None) is not None:
            self._persist()

    def _persist(self) -> None:
        document = {"format": 1, "passwords": dict(sorted(self._passwords.items()))}
        replace_file_durably(self._path, json.dumps(document, indent=1).encode(), mode=0o600)


@dataclass(frozen=True)
class _Existing:
    superuser: bool
    locked_down: bool  # LOGIN and none of SUPERUSER, CREATEDB, CREATEROLE, REPLICATION, BYPASSRLS
    marked: bool


class RoleMirror:
    """CREATE / ALTER / DROP of mirrored roles through the admin connection. Thread-safe; a role already mirrored
    (with the same superuser flag) by this process costs nothing, so sessions may call `ensure` at every start."""

    def __init__(self, admin_conninfo: str, admin_role: str, database: str, passwords: RolePasswords | None) -> None:
        self._admin_conninfo = admin_conninfo
        self._admin_role = admin_role
        self._database = database
        self._passwords = passwords  # None: the embedded store (trust on its private socket)
        self._lock = threading.Lock()
        self._mirrored: dict[str, bool] = {}  # role -> superuser flag it was mirrored with

    def password_of(self, role: str) -> str | None:
        return self._passwords.get(role) if self._passwords is not None else None

    def ensure(self, role: str, *, superuser: bool, recheck: bool = False) -> None:
        """`recheck`: look at the server even if this process mirrored the role already (someone else may have
        dropped it: another headrace on the same external cluster, or a DBA)."""
        self._refuse_admin(role)
        with self._lock:
            if self._mirrored.get(role) is superuser and not recheck:
                return
            with self._connect() as conn:
                existing = self._existing(conn, role)
                if existing is None:
                    self._create(conn, role)
                else:
                    self._adopt(conn, role, existing)
                self._grant(conn, role, superuser=superuser)
            self._mirrored[role] = superuser

    def drop(self, role: str) -> None:
        """REASSIGN OWNED to the admin role, DROP OWNED, DROP ROLE; nothing if the store has no such role."""
        self._refuse_admin(role)
        with self._lock:
            self._mirrored.pop(role, None)
            with self._connect() as conn:
                existing = self._existing(conn, role)
                if existing is None:
                    return
                self._refuse_foreign(role, existing)
                name = sql.Identifier(role)
                # REASSIGN / DROP OWNED need the privileges of the role: a CREATEROLE admin (PostgreSQL 15) may
                # grant itself membership in any role that is not a superuser.
                conn.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(name))
                conn.execute(sql.SQL("REASSIGN OWNED BY {} TO CURRENT_USER").format(name))
                conn.execute(sql.SQL("DROP OWNED BY {}").format(name))
                conn.execute(sql.SQL("DROP ROLE {}").format(name))
            if self._passwords is not None:
                self._passwords.forget(role)

    def _connect(self) -> psycopg.Connection[tuple[object, ...]]:
        """The admin connection, holding the lock that serializes role mirroring in this database across
        processes (until it closes): PostgreSQL fails concurrent GRANTs on one object with "tuple concurrently
        updated" (XX000)."""
        conn = psycopg.connect(self._admin_conninfo, autocommit=True, connect_timeout=10)
        try:
            conn.execute("SELECT pg_advisory_lock(%s)", (MIRROR_LOCK_KEY,))
        except BaseException:
            conn.close()
            raise
        return conn

    def _refuse_admin(self, role: str) -> None:
        if role == self._admin_role:
            raise RoleMirrorError("42939", f'role "{role}" is the store PostgreSQL\'s admin role and cannot be '
                                           "mirrored: choose another role name")
        if role in (SUBSCRIBE_READER_ROLE, TABLE_WRITES_ROLE):
            raise RoleMirrorError("42939", f'role name "{role}" is reserved for headrace\'s own use in the store '
                                           "PostgreSQL: choose another role name")

    def _refuse_foreign(self, role: str, existing: _Existing) -> None:
        if self._passwords is not None and not existing.marked:
            raise RoleMirrorError("42710", f'role "{role}" already exists in the store PostgreSQL and was not '
                                           "created by headrace: it is not taken over")

    @staticmethod
    def _existing(conn: psycopg.Connection[tuple[object, ...]], role: str) -> _Existing | None:
        row = conn.execute(
            "SELECT rolsuper, rolcanlogin AND NOT (rolsuper OR rolcreatedb OR rolcreaterole OR rolreplication "
            "OR rolbypassrls), shobj_description(oid, 'pg_authid') IS NOT DISTINCT FROM %s "
            "FROM pg_roles WHERE rolname = %s", (MIRROR_MARK, role)).fetchone()
        return _Existing(bool(row[0]), bool(row[1]), bool(row[2])) if row is not None else None

    def _create(self, conn: psycopg.Connection[tuple[object, ...]], role: str) -> None:
        name = sql.Identifier(role)
        statement = sql.SQL("CREATE ROLE {} {}").format(name, _LOCKED_DOWN)
        if self._passwords is not None:
            statement = sql.SQL("{} PASSWORD {}").format(statement, self._verifier(self._passwords.new(role)))
        try:
            conn.execute(statement)
        except errors.DuplicateObject:  # created meanwhile by another headrace on the same store
            existing = self._existing(conn, role)
            if existing is None:
                raise
            self._adopt(conn, role, existing)
            return
        conn.execute(sql.SQL("COMMENT ON ROLE {} IS {}").format(name, sql.Literal(MIRROR_MARK)))

    def _adopt(self, conn: psycopg.Connection[tuple[object, ...]], role: str, existing: _Existing) -> None:
        self._refuse_foreign(role, existing)
        name = sql.Identifier(role)
        if not existing.locked_down:
            conn.execute(sql.SQL("ALTER ROLE {} {}").format(name, _LOCKED_DOWN))
        if self._passwords is not None and self._passwords.get(role) is None:
            # The password file was lost (or the role was made by another headrace on this store): a new one.
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(name, self._verifier(self._passwords.new(role))))

    def _grant(self, conn: psycopg.Connection[tuple[object, ...]], role: str, *, superuser: bool) -> None:
        name, database = sql.Identifier(role), sql.Identifier(self._database)
        conn.execute(sql.SQL("GRANT CONNECT, TEMP ON DATABASE {} TO {}").format(database, name))
        if superuser:
            conn.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(database, name))
            conn.execute(sql.SQL("GRANT CREATE, USAGE ON SCHEMA public TO {}").format(name))
            # every session's statement in pg_stat_activity and headrace_internal.sessions, as a PostgreSQL
            # superuser sees them (metrics/sessions.py)
            conn.execute(sql.SQL("GRANT pg_read_all_stats TO {}").format(name))
        else:
            # A headrace superuser demoted since: it keeps none of what being one gave it here.
            conn.execute(sql.SQL("REVOKE CREATE ON DATABASE {} FROM {}").format(database, name))
            conn.execute(sql.SQL("REVOKE CREATE ON SCHEMA public FROM {}").format(name))
            conn.execute(sql.SQL("REVOKE pg_read_all_stats FROM {}").format(name))

    @staticmethod
    def _verifier(password: str) -> sql.Literal:
        return sql.Literal(make_scram_verifier(password).text())
