"""Privileges as PostgreSQL keeps them: an owner per object and an access control list (ACL) of aclitems.

An aclitem is `grantee=privileges/grantor` in PostgreSQL's text form (`alice=arw/headrace`; PUBLIC is the empty
grantee: `=r/headrace`), one letter per privilege (r SELECT, a INSERT, w UPDATE, d DELETE, D TRUNCATE,
x REFERENCES, t TRIGGER, U USAGE, C CREATE, c CONNECT, T TEMPORARY). An object whose ACL was never changed has
none stored (NULL in pg_class.relacl) and its default applies (PostgreSQL's acldefault): the owner holds every
privilege of the object's kind; the database also grants PUBLIC CONNECT and TEMPORARY, schema public (PostgreSQL
15) grants PUBLIC USAGE only, not CREATE. Headrace's own kinds, secrets and connections, take USAGE (as in
Materialize); their default is the owner's USAGE alone.

There are no role memberships and no grant options in headrace: a role's privileges are those granted to it or
to PUBLIC; only the owner (or a superuser, acting as the owner) grants and revokes, so every grantor is the
owner. Pure data and functions: the catalog stores ACLs, the coordinator checks them (coordinator/privileges.py).

    acl = grant(None, "relation", owner="headrace", grantee="alice", letters="r")
    acl_text(acl)                                   # ['headrace=arwdDxt/headrace', 'alice=r/headrace']
    holds(acl, "relation", "headrace", "alice", "r")  # True
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PUBLIC = ""  # the grantee PUBLIC, as aclitem writes it (an empty name)

PRIVILEGE_LETTERS: dict[str, str] = {
    "SELECT": "r", "INSERT": "a", "UPDATE": "w", "DELETE": "d", "TRUNCATE": "D", "REFERENCES": "x",
    "TRIGGER": "t", "USAGE": "U", "CREATE": "C", "CONNECT": "c", "TEMPORARY": "T", "TEMP": "T",
}
PRIVILEGE_NAMES: dict[str, str] = {letter: name for name, letter in PRIVILEGE_LETTERS.items() if name != "TEMP"}
LETTER_ORDER = "arwdDxtXUCTc"  # PostgreSQL's ACL_ALL_RIGHTS_STR order (15: no MAINTAIN)

# Every privilege an object of each kind can have (PostgreSQL's ACL_ALL_RIGHTS_*).
ALL_RIGHTS: dict[str, str] = {
    "relation": "arwdDxt", "schema": "UC", "database": "CTc", "secret": "U", "connection": "U",
}

_NAME_NEEDS_QUOTES = re.compile(r"[^a-z0-9_]")


@dataclass(frozen=True, slots=True)
class AclItem:
    grantee: str  # a role name, or PUBLIC ("")
    grantor: str
    privileges: str  # letters, in LETTER_ORDER

    def text(self) -> str:
        return f"{_quoted(self.grantee)}={self.privileges}/{_quoted(self.grantor)}"


Acl = tuple[AclItem, ...]


def ordered(letters: str) -> str:
    return "".join(letter for letter in LETTER_ORDER if letter in letters)


def default_acl(kind: str, owner: str) -> Acl:
    """PostgreSQL's acldefault for the kind (schema public as PostgreSQL 15 makes it)."""
    items = [AclItem(owner, owner, ALL_RIGHTS[kind])]
    if kind == "database":
        items.insert(0, AclItem(PUBLIC, owner, "Tc"))
    elif kind == "schema":
        items.append(AclItem(PUBLIC, owner, "U"))
    return tuple(items)


def effective(acl: Acl | None, kind: str, owner: str) -> Acl:
    return default_acl(kind, owner) if acl is None else acl


def holds(acl: Acl | None, kind: str, owner: str, role: str, letter: str) -> bool:
    """Whether `role` holds privilege `letter` through the ACL (granted to it or to PUBLIC). Superusers and
    the question of ownership are the caller's (ownership is not a privilege: an owner may revoke its own)."""
    return any(item.grantee in (role, PUBLIC) and letter in item.privileges for item in effective(acl, kind, owner))


def grant(acl: Acl | None, kind: str, *, owner: str, grantee: str, letters: str) -> Acl:
    """The ACL after GRANT `letters` TO `grantee` (the owner grants: headrace has no grant options)."""
    items = list(effective(acl, kind, owner))
    for index, item in enumerate(items):
        if item.grantee == grantee and item.grantor == owner:
            items[index] = AclItem(grantee, owner, ordered(item.privileges + letters))
            return tuple(items)
    items.append(AclItem(grantee, owner, ordered(letters)))
    return tuple(items)


def revoke(acl: Acl | None, kind: str, *, owner: str, grantee: str, letters: str) -> Acl:
    """The ACL after REVOKE `letters` FROM `grantee`; an item left with no privileges goes away."""
    items = []
    for item in effective(acl, kind, owner):
        if item.grantee == grantee and item.grantor == owner:
            remaining = "".join(letter for letter in item.privileges if letter not in letters)
            if remaining:
                items.append(AclItem(grantee, owner, remaining))
        else:
            items.append(item)
    return tuple(items)


def acl_text(acl: Acl | None) -> list[str] | None:
    """The ACL as pg_class.relacl shows it: None while it is the default (NULL)."""
    return None if acl is None else [item.text() for item in acl]


def acl_from_entry(entry: list[str] | None) -> Acl | None:
    if entry is None:
        return None
    return tuple(parse_aclitem(text) for text in entry)


def parse_aclitem(text: str) -> AclItem:
    """`grantee=privileges/grantor`, names possibly double-quoted (the inverse of AclItem.text)."""
    grantee, rest = _take_name(text, "=")
    privileges, _, grantor_text = rest.partition("/")  # letters never hold a "/"; a quoted grantor may
    grantor, _ = _take_name(grantor_text, None)
    if not set(privileges) <= set(LETTER_ORDER):
        raise ValueError(f"invalid aclitem {text!r}")
    return AclItem(grantee, grantor, ordered(privileges))


def mentions(acl: Acl | None, role: str) -> bool:
    """Whether a stored (non-default) ACL grants the role anything (DROP ROLE refuses while one does)."""
    return acl is not None and any(item.grantee == role and item.grantor != role for item in acl)


def _quoted(name: str) -> str:
    if name and _NAME_NEEDS_QUOTES.search(name):
        return '"' + name.replace('"', '""') + '"'
    return name


def _take_name(text: str, stop: str | None) -> tuple[str, str]:
    """A possibly double-quoted name at the start of `text`, up to `stop` (consumed); and what follows."""
    if text.startswith('"'):
        index, name = 1, []
        while index < len(text):
            if text[index] == '"':
                if text[index + 1:index + 2] == '"':
                    name.append('"')
                    index += 2
                    continue
                index += 1
                break
            name.append(text[index])
            index += 1
        rest = text[index:]
        if stop is not None:
            if not rest.startswith(stop):
                raise ValueError(f"invalid aclitem {text!r}")
            rest = rest[1:]
        return "".join(name), rest
    if stop is None:
        return text, ""
    name, found, rest = text.partition(stop)
    if not found:
        raise ValueError(f"invalid aclitem {text!r}")
    return name, rest
