"""Roles: who may log in, and the SCRAM-SHA-256 verifier each password is kept as (never the
password itself), in `<data>/roles.json`, replaced atomically like the catalog.

Verifiers use PostgreSQL's own text form, so one could be copied from pg_authid and back:
    SCRAM-SHA-256$<iterations>:<salt base64>$<StoredKey base64>:<ServerKey base64>

    roles = RoleCatalog(data_dir)          # or RoleCatalog(None): in memory only
    roles.create("alice", login=True, password="secret")
    roles.list_roles()                     # for pg_roles: name, oid, superuser, login, has_password
    roles.password_verifier("alice")       # for authentication
"""

from __future__ import annotations

import base64
import json
import re
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import scramp

from headrace.durable import replace_file_durably

ROLES_FILE = "roles.json"
FORMAT_VERSION = 1
BOOTSTRAP_SUPERUSER = "headrace"
BOOTSTRAP_OID = 10  # PostgreSQL's bootstrap superuser has oid 10 too
FIRST_USER_OID = 16384  # PostgreSQL's FirstNormalObjectId
SCRAM_ITERATIONS = 4096  # PostgreSQL's default scram_iterations

_VERIFIER = re.compile(r"SCRAM-SHA-256\$(\d+):([A-Za-z0-9+/=]+)\$([A-Za-z0-9+/=]+):([A-Za-z0-9+/=]+)")
_SCRAM = scramp.ScramMechanism("SCRAM-SHA-256")


@dataclass(frozen=True, slots=True)
class ScramVerifier:
    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    def text(self) -> str:
        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode("ascii")
        return f"SCRAM-SHA-256${self.iterations}:{b64(self.salt)}${b64(self.stored_key)}:{b64(self.server_key)}"

    def matches_password(self, password: str) -> bool:
        """The check behind cleartext password authentication."""
        _, stored_key, _, _ = _SCRAM.make_auth_info(password, iteration_count=self.iterations, salt=self.salt)
        return bool(stored_key == self.stored_key)


def make_scram_verifier(password: str, iterations: int = SCRAM_ITERATIONS) -> ScramVerifier:
    salt, stored_key, server_key, count = _SCRAM.make_auth_info(password, iteration_count=iterations)
    return ScramVerifier(count, salt, stored_key, server_key)


def parse_scram_verifier(text: str) -> ScramVerifier | None:
    """A verifier in PostgreSQL's text form, or None if `text` is not one (then it is a password)."""
    found = _VERIFIER.fullmatch(text)
    if found is None:
        return None
    try:
        return ScramVerifier(int(found.group(1)), base64.b64decode(found.group(2), validate=True),
                             base64.b64decode(found.group(3), validate=True),
                             base64.b64decode(found.group(4), validate=True))
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Role:
    name: str
    oid: int
    superuser: bool = False
    login: bool = False
    verifier: str | None = None  # PostgreSQL's SCRAM text form; None = no password

    @property
    def has_password(self) -> bool:
        return self.verifier is not None


class RoleError(Exception):
    """A role operation that cannot be done; `kind` says why, the coordinator maps it to a SQLSTATE."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # "duplicate" | "undefined" | "reserved"


class RoleCatalog:
    """Thread-safe; every change is durable before the call returns (when backed by a directory)."""

    def __init__(self, data_dir: Path | None) -> None:
        self._path = data_dir / ROLES_FILE if data_dir is not None else None
        self._lock = threading.Lock()
        self._next_oid = FIRST_USER_OID
        self._roles: dict[str, Role] = {
            BOOTSTRAP_SUPERUSER: Role(BOOTSTRAP_SUPERUSER, BOOTSTRAP_OID, superuser=True, login=True)}
        if self._path is not None and self._path.exists():
            stored = json.loads(self._path.read_text())
            self._next_oid = int(stored["next_oid"])
            for entry in stored["roles"]:
                role = Role(entry["name"], int(entry["oid"]), bool(entry["superuser"]), bool(entry["login"]),
                            entry.get("verifier"))
                self._roles[role.name] = role

    def list_roles(self) -> list[Role]:
        """Every role, by oid (what pg_roles shows; the verifier is for authentication only)."""
        with self._lock:
            return sorted(self._roles.values(), key=lambda role: role.oid)

    def find(self, name: str) -> Role | None:
        return self._roles.get(name)

    def password_verifier(self, name: str) -> ScramVerifier | None:
        """The verifier of a role that may log in with a password; None for anyone else."""
        role = self._roles.get(name)
        if role is None or not role.login or role.verifier is None:
            return None
        return parse_scram_verifier(role.verifier)

    def create(self, name: str, *, login: bool = False, superuser: bool = False,
               password: str | None = None) -> Role:
        with self._lock:
            if name in self._roles:
                raise RoleError("duplicate", f'role "{name}" already exists')
            role = Role(name, self._next_oid, superuser=superuser, login=login, verifier=_verifier_text(password))
            self._next_oid += 1
            self._roles[name] = role
            self._persist()
            return role

    def alter(self, name: str, *, login: bool | None = None, superuser: bool | None = None,
              password: str | None = None, clear_password: bool = False) -> Role:
        with self._lock:
            role = self._roles.get(name)
            if role is None:
                raise RoleError("undefined", f'role "{name}" does not exist')
            if name == BOOTSTRAP_SUPERUSER and (login is False or superuser is False):
                raise RoleError("reserved", f'role "{name}" must stay a superuser that can log in')
            changed = replace(role, login=role.login if login is None else login,
                              superuser=role.superuser if superuser is None else superuser)
            if clear_password:
                changed = replace(changed, verifier=None)
            elif password is not None:
                changed = replace(changed, verifier=_verifier_text(password))
            self._roles[name] = changed
            self._persist()
            return changed

    def drop(self, name: str) -> None:
        with self._lock:
            if name not in self._roles:
                raise RoleError("undefined", f'role "{name}" does not exist')
            if name == BOOTSTRAP_SUPERUSER:
                raise RoleError("reserved", f'cannot drop role "{name}": the bootstrap superuser')
            del self._roles[name]
            self._persist()

    def _persist(self) -> None:
        """Write-fsync-rename-fsync, as the catalog does."""
        if self._path is None:
            return
        document = {
            "format": FORMAT_VERSION,
            "next_oid": self._next_oid,
            "roles": [{"name": role.name, "oid": role.oid, "superuser": role.superuser, "login": role.login,
                       "verifier": role.verifier}
                      for role in sorted(self._roles.values(), key=lambda role: role.oid)
                      if role.name != BOOTSTRAP_SUPERUSER or role.verifier is not None],
        }
        replace_file_durably(self._path, json.dumps(document, indent=1).encode())


def _verifier_text(password: str | None) -> str | None:
    """A given SCRAM verifier is kept as is (as PostgreSQL does); a password becomes one."""
    if password is None:
        return None
    if parse_scram_verifier(password) is not None:
        return password
    return make_scram_verifier(password).text()
