"""GRANT / REVOKE: changes to the catalog's ACLs (catalog/privileges.py), with PostgreSQL's rules and SQLSTATEs.

Objects: relations (ON [TABLE] x, ON ALL TABLES IN SCHEMA public: sources, tables, materialized views), schema
public, the database, secrets and connections (USAGE, as in Materialize). Only the object's owner or a superuser
grants (headrace has no grant options: WITH GRANT OPTION is refused with 0A000); the grantor recorded is the owner,
as PostgreSQL records it when a superuser grants."""

from __future__ import annotations

from headrace.catalog.items import DEFAULT_DATABASE, DEFAULT_SCHEMA
from headrace.catalog.privileges import ALL_RIGHTS, PRIVILEGE_LETTERS, Acl, grant, holds, mentions, revoke
from headrace.catalog.roles import BOOTSTRAP_SUPERUSER
from headrace.coordinator.privileges import CatalogObject, InsufficientPrivilege, Privileges
from headrace.coordinator.responses import CommandComplete
from headrace.errors import FeatureNotSupported, HeadraceError, UndefinedObject
from headrace.sql.ast import GrantPrivileges
from headrace.sql.role_statements import CURRENT_ROLE_GRANTEE

InvalidGrantOperation = "0LP01"
_SYSTEM_SCHEMAS = ("pg_catalog", "information_schema", "headrace_internal")


def execute_grant(privileges: Privileges, user: str, statement: GrantPrivileges) -> CommandComplete:
    revoking = bool(statement.args["revoke"])
    verb = "REVOKE" if revoking else "GRANT"
    if statement.args.get("grant_option"):
        raise FeatureNotSupported("grant options are not supported",
                                  hint="only an object's owner (or a superuser) grants privileges on it")
    grantees = [_grantee(privileges, user, name) for name in statement.args["grantees"]]
    kind = statement.args["kind"]
    targets = _targets(privileges, kind, statement.args["objects"])
    acl_kind = {"table": "relation", "all tables": "relation"}.get(kind, kind)
    letters = _letters(statement.args["privileges"], acl_kind, "table" if acl_kind == "relation" else acl_kind)
    catalog = privileges.catalog
    notices: list[str] = []
    for target in targets:
        owner = BOOTSTRAP_SUPERUSER if target is None else catalog.owner_of(target.item_id)
        acl: Acl | None = catalog.schema_acl if kind == "schema" else catalog.database_acl if kind == "database" \
            else catalog.acl_of(target.item_id) if target is not None else None
        if not privileges.is_superuser(user) and owner != user:
            name = _target_name(statement, kind) if target is None else target.name
            # PostgreSQL: a role holding some privilege but no grant option is warned; one holding none refused.
            if any(holds(acl, acl_kind, owner, user, letter) for letter in ALL_RIGHTS[acl_kind]):
                notices.append(f'no privileges could be revoked for "{name}"' if revoking
                               else f'no privileges were granted for "{name}"')
                continue
            what = f"{kind} {name}" if target is None else f"{target.kind} {target.name}"
            raise InsufficientPrivilege(f"permission denied for {what}")
        for grantee in grantees:
            change = revoke if revoking else grant
            acl = change(acl, acl_kind, owner=owner, grantee=grantee, letters=letters)
        if kind == "schema":
            catalog.set_schema_acl(acl)
        elif kind == "database":
            catalog.set_database_acl(acl)
        else:
            assert target is not None
            catalog.set_acl(target.item_id, acl)
    return CommandComplete(verb, tuple(notices))


def role_dependents(privileges: Privileges, role: str) -> list[str]:
    """What keeps DROP ROLE from dropping `role`, in PostgreSQL's words ("owner of table t", "privileges for
    schema public"); empty if nothing."""
    catalog = privileges.catalog
    lines = []
    for kind, name, item_id in catalog.owned_items():
        if catalog.owner_of(item_id) == role:
            lines.append(f"owner of {kind} {name}")
        if mentions(catalog.acl_of(item_id), role):
            lines.append(f"privileges for {kind} {name}")
    if mentions(catalog.schema_acl, role):
        lines.append(f"privileges for schema {DEFAULT_SCHEMA}")
    if mentions(catalog.database_acl, role):
        lines.append(f"privileges for database {DEFAULT_DATABASE}")
    return lines


def _grantee(privileges: Privileges, user: str, name: str) -> str:
    if name == CURRENT_ROLE_GRANTEE:
        return user
    if name and privileges.roles.find(name) is None:
        raise UndefinedObject(f'role "{name}" does not exist', sqlstate="42704")
    return name


def _targets(privileges: Privileges, kind: str, objects: list[tuple[str | None, str]]) -> list[CatalogObject | None]:
    """The objects named (None: schema public or the database, which have no item)."""
    targets: list[CatalogObject | None] = []
    for schema, name in objects:
        if kind in ("schema", "all tables"):
            _check_schema(name)
            if kind == "schema":
                targets.append(None)
            else:
                targets += [privileges.relation(DEFAULT_SCHEMA, item_name)
                            for item_kind, item_name, _ in privileges.catalog.owned_items()
                            if item_kind in ("source", "table", "materialized view")]
        elif kind == "database":
            if name != DEFAULT_DATABASE:
                raise HeadraceError(f'database "{name}" does not exist', sqlstate="3D000")
            targets.append(None)
        elif kind == "table":
            if schema is not None:
                _check_schema(schema)
            target = privileges.relation(schema, name)
            if target is None:
                shown = f"{schema}.{name}" if schema else name
                raise HeadraceError(f'relation "{shown}" does not exist', sqlstate="42P01")
            targets.append(target)
        else:
            target = privileges.named(kind, schema, name)
            if target is None:
                raise UndefinedObject(f'{kind} "{name}" does not exist', sqlstate="42704")
            targets.append(target)
    return targets


def _check_schema(name: str) -> None:
    if name in _SYSTEM_SCHEMAS:
        raise FeatureNotSupported(f"privileges on schema {name} cannot be changed")
    if name != DEFAULT_SCHEMA:
        raise HeadraceError(f'schema "{name}" does not exist', sqlstate="3F000")


def _letters(names: list[str], acl_kind: str, kind_word: str) -> str:
    if names == ["ALL"]:
        return ALL_RIGHTS[acl_kind]
    letters = ""
    for name in names:
        letter = PRIVILEGE_LETTERS[name]
        if letter not in ALL_RIGHTS[acl_kind]:
            raise HeadraceError(f"invalid privilege type {name} for {kind_word}", sqlstate=InvalidGrantOperation)
        letters += letter
    return letters


def _target_name(statement: GrantPrivileges, kind: str) -> str:
    return statement.args["objects"][0][1] if kind in ("schema", "database") else ""
