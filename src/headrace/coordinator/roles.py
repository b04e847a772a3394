"""CREATE / ALTER / DROP ROLE: changes to the role catalog, with PostgreSQL's rules on who may do
what and its SQLSTATEs. Passwords are turned into SCRAM verifiers by the catalog, never stored."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headrace.catalog.roles import RoleCatalog, RoleError
from headrace.coordinator.responses import CommandComplete
from headrace.errors import HeadraceError
from headrace.sql.ast import AlterRole, CreateRole, DropRole

RoleStatement = CreateRole | AlterRole | DropRole
ROLE_STATEMENTS = (CreateRole, AlterRole, DropRole)

_SQLSTATES = {"duplicate": "42710", "undefined": "42704", "reserved": "42939"}


class InsufficientPrivilege(HeadraceError):
    sqlstate = "42501"
    http_status = 403


def execute_role_statement(roles: RoleCatalog, session_user: str, statement: RoleStatement,
                           dependents: Callable[[str], list[str]] = lambda role: []) -> CommandComplete:
    """Run one role statement for `session_user`. Only superusers manage roles; anyone may change
    their own password. A user unknown to the catalog got in by a trust rule and is trusted as a
    superuser, like the bootstrap one. `dependents(role)`: what the role owns or was granted, in
    PostgreSQL's words (DROP ROLE refuses while there is any, 2BP01)."""
    try:
        if isinstance(statement, CreateRole):
            _require_superuser(roles, session_user, "create role")
            options: dict[str, Any] = statement.args["options"]
            roles.create(statement.this, login=bool(options.get("login", False)),
                         superuser=bool(options.get("superuser", False)), password=options.get("password"))
            return CommandComplete("CREATE ROLE")
        if isinstance(statement, AlterRole):
            options = statement.args["options"]
            own_password_only = statement.this == session_user and set(options) <= {"password"}
            if not own_password_only:
                _require_superuser(roles, session_user, "alter role")
            roles.alter(statement.this, login=options.get("login"), superuser=options.get("superuser"),
                        password=options.get("password"),
                        clear_password="password" in options and options["password"] is None)
            return CommandComplete("ALTER ROLE")
        _require_superuser(roles, session_user, "drop role")
        notices = []
        for name in statement.args["names"]:
            if name == session_user:
                raise HeadraceError("current user cannot be dropped", sqlstate="55006")
            if roles.find(name) is None and statement.args.get("if_exists"):
                notices.append(f'role "{name}" does not exist, skipping')
                continue
            depending = dependents(name)
            if depending:
                raise HeadraceError(f'role "{name}" cannot be dropped because some objects depend on it',
                                    sqlstate="2BP01", detail="\n".join(depending))
            roles.drop(name)
        return CommandComplete("DROP ROLE", tuple(notices))
    except RoleError as exc:
        raise HeadraceError(str(exc), sqlstate=_SQLSTATES[exc.kind]) from None


def _require_superuser(roles: RoleCatalog, user: str, action: str) -> None:
    role = roles.find(user)
    if role is not None and not role.superuser:
        raise InsufficientPrivilege(f"permission denied to {action}")
