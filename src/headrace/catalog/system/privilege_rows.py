"""What has_*_privilege and `\\dp` read: the ACLs in PostgreSQL's aclitem text form (pg_class.relacl,
pg_namespace.nspacl, pg_database.datacl) and, per role and object, each privilege the role holds (the
hr_has_privilege macro's tables, catalog/system/macros.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from headrace.catalog.privileges import ALL_RIGHTS, PRIVILEGE_NAMES, PUBLIC, Acl, effective
from headrace.catalog.system.rows import DATABASE_OID, PUBLIC_OID, Role, Row

BOOTSTRAP_OWNER = "headrace"


class PrivilegeSource(Protocol):
    """The catalog's view of owners and ACLs (catalog/catalog.py)."""

    generation: int
    schema_acl: Acl | None
    database_acl: Acl | None

    def owner_of(self, item_id: str) -> str: ...

    def acl_of(self, item_id: str) -> Acl | None: ...


@dataclass(frozen=True, slots=True)
class PrivilegeObject:
    kind: str  # "relation" | "schema" | "database"
    oid: int
    name: str
    owner: str
    acl: Acl | None


def objects_of(source: PrivilegeSource, relations: Sequence[tuple[int, str, str]], database: str) -> list[PrivilegeObject]:
    """`relations`: (oid, name, item id) of each user relation."""
    objects = [PrivilegeObject("relation", oid, name, source.owner_of(item_id), source.acl_of(item_id))
               for oid, name, item_id in relations]
    objects.append(PrivilegeObject("schema", PUBLIC_OID, "public", BOOTSTRAP_OWNER, source.schema_acl))
    objects.append(PrivilegeObject("database", DATABASE_OID, database, BOOTSTRAP_OWNER, source.database_acl))
    return objects


def privilege_tables(objects: Sequence[PrivilegeObject], roles: Sequence[Role]) -> tuple[list[Row], list[Row]]:
    """The rows of privilege_objects and privileges."""
    object_rows: list[Row] = [{"kind": o.kind, "oid": o.oid, "name": o.name} for o in objects]
    held: list[Row] = []
    for role in roles:
        for target in objects:
            if role.superuser:
                letters = ALL_RIGHTS[target.kind]
            else:
                letters = "".join(item.privileges for item in effective(target.acl, target.kind, target.owner)
                                  if item.grantee in (role.name, PUBLIC))
            for letter in dict.fromkeys(letters):
                names = [PRIVILEGE_NAMES[letter]] + (["TEMP"] if letter == "T" else [])
                held += [{"role": role.name, "role_oid": role.oid, "kind": target.kind, "oid": target.oid,
                          "privilege": name} for name in names]
    return object_rows, held


def acl_array(acl: Acl | None) -> list[str] | None:
    return None if acl is None else [item.text() for item in acl]
