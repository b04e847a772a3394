"""The ACL model (catalog/privileges.py), its persistence in the catalog, the allow-lists (catalog/host_access.py)
and the GRANT / REVOKE grammar, without a server."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.catalog.catalog import CREATING_ROLE, Catalog
from headrace.catalog.host_access import HostAccess
from headrace.catalog.privileges import (
    ALL_RIGHTS, PUBLIC, AclItem, acl_from_entry, acl_text, default_acl, grant, holds, mentions, parse_aclitem, revoke)
from headrace.catalog.roles import RoleCatalog
from headrace.coordinator.privileges import InsufficientPrivilege, Privileges
from headrace.errors import FeatureNotSupported, HeadraceError, SyntaxError_
from headrace.sql.ddl import item_from_create_sql
from headrace.sql.parser import parse_statement
from headrace.sql.table_statements import table_from_create_sql

ROLE_NAMES = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=12)
KINDS = st.sampled_from(sorted(ALL_RIGHTS))


def letters_of(kind: str) -> st.SearchStrategy[str]:
    return st.sets(st.sampled_from(ALL_RIGHTS[kind]), min_size=1).map("".join)


def test_defaults_are_postgresql_15s() -> None:
    assert acl_text(default_acl("relation", "headrace")) == ["headrace=arwdDxt/headrace"]
    assert acl_text(default_acl("schema", "headrace")) == ["headrace=UC/headrace", "=U/headrace"]
    assert acl_text(default_acl("database", "headrace")) == ["=Tc/headrace", "headrace=CTc/headrace"]
    assert acl_text(default_acl("secret", "o")) == ["o=U/o"]
    assert holds(None, "schema", "headrace", "alice", "U") and not holds(None, "schema", "headrace", "alice", "C")
    assert holds(None, "relation", "alice", "alice", "r") and not holds(None, "relation", "alice", "bob", "r")


@given(ROLE_NAMES, ROLE_NAMES, st.text(alphabet="arwdDxtUCTc", max_size=11))
def test_aclitem_text_round_trips(grantee: str, grantor: str, letters: str) -> None:
    item = AclItem(grantee, grantor, "".join(dict.fromkeys(letters)))
    parsed = parse_aclitem(item.text())
    assert (parsed.grantee, parsed.grantor, set(parsed.privileges)) == (grantee, grantor, set(item.privileges))


def test_aclitem_quotes_names_as_postgresql_does() -> None:
    assert AclItem("Bob", "headrace", "r").text() == '"Bob"=r/headrace'
    assert AclItem('a"b', "headrace", "r").text() == '"a""b"=r/headrace'
    assert AclItem(PUBLIC, "headrace", "r").text() == "=r/headrace"


@given(KINDS.flatmap(lambda kind: st.tuples(st.just(kind), letters_of(kind), letters_of(kind))),
       st.sampled_from(["alice", "bob", PUBLIC]))
def test_grant_then_revoke(case: tuple[str, str, str], grantee: str) -> None:
    kind, granted, revoked = case
    public_default = "".join(item.privileges for item in default_acl(kind, "owner") if item.grantee == PUBLIC)
    acl = grant(None, kind, owner="owner", grantee=grantee, letters=granted)
    after = revoke(acl, kind, owner="owner", grantee=grantee, letters=revoked)
    reaches_alice = grantee in ("alice", PUBLIC)
    for letter in ALL_RIGHTS[kind]:
        assert holds(acl, kind, "owner", "alice", letter) == (letter in public_default
                                                             or reaches_alice and letter in granted)
        if grantee == PUBLIC:
            expected = letter in public_default + granted and letter not in revoked
        else:
            expected = letter in public_default or reaches_alice and letter in granted and letter not in revoked
        assert holds(after, kind, "owner", "alice", letter) == expected
        assert holds(after, kind, "owner", "owner", letter)  # the owner's own item is untouched
    assert acl_from_entry(acl_text(after)) == after
    assert mentions(after, "alice") == any(item.grantee == "alice" for item in after)


def test_revoking_everything_removes_the_item() -> None:
    acl = grant(None, "relation", owner="o", grantee="alice", letters="ra")
    assert acl_text(revoke(acl, "relation", owner="o", grantee="alice", letters="arwdDxt")) == ["o=arwdDxt/o"]


def test_catalog_keeps_owners_and_acls_and_reads_an_old_catalog(tmp_path: Path) -> None:
    catalog = Catalog(tmp_path, item_from_create_sql)
    token = CREATING_ROLE.set("alice")
    try:
        table = table_from_create_sql(catalog.allocate_id(), "CREATE TABLE t (id int PRIMARY KEY)")
        catalog.add_table(table)
    finally:
        CREATING_ROLE.reset(token)
    legacy = table_from_create_sql(catalog.allocate_id(), "CREATE TABLE old (id int PRIMARY KEY)")
    catalog.add_table(legacy)  # no statement running: owned by the bootstrap superuser
    catalog.set_acl(table.id, grant(None, "relation", owner="alice", grantee="bob", letters="r"))
    catalog.set_schema_acl(grant(None, "schema", owner="headrace", grantee="alice", letters="C"))
    reopened = Catalog(tmp_path, item_from_create_sql)
    assert reopened.owner_of(table.id) == "alice" and reopened.owner_of(legacy.id) == "headrace"
    assert acl_text(reopened.acl_of(table.id)) == ["alice=arwdDxt/alice", "bob=r/alice"]
    assert acl_text(reopened.schema_acl) == ["headrace=UC/headrace", "=U/headrace", "alice=C/headrace"]
    reopened.remove_table(table.id)
    assert reopened.acl_of(table.id) is None

    document = json.loads((tmp_path / "catalog.json").read_text())
    for key in ("privileges", "schema_acl", "database_acl"):
        del document[key]
    (tmp_path / "catalog.json").write_text(json.dumps(document))
    old = Catalog(tmp_path, item_from_create_sql)
    assert [t.name for t in old.tables()] == ["old"] and old.owner_of(legacy.id) == "headrace"
    assert old.schema_acl is None


def test_privilege_checks(tmp_path: Path) -> None:
    catalog = Catalog(tmp_path, item_from_create_sql)
    roles = RoleCatalog(None)
    roles.create("alice", login=True)
    roles.create("root", login=True, superuser=True)
    table = table_from_create_sql(catalog.allocate_id(), "CREATE TABLE t (id int PRIMARY KEY)")
    catalog.add_table(table)
    privileges = Privileges(catalog, roles)
    with pytest.raises(InsufficientPrivilege, match="permission denied for table t"):
        privileges.require_relations("alice", [(None, "t")])
    privileges.require_relations("root", [(None, "t")])
    with pytest.raises(InsufficientPrivilege):
        privileges.require_relations("dropped", [(None, "t")])  # a role dropped while its session lasts
    privileges.require_relations("alice", [(None, "no_such_relation")])  # existence is the statement's error
    catalog.set_acl(table.id, grant(None, "relation", owner="headrace", grantee="alice", letters="r"))
    privileges.require_relations("alice", [("public", "t")])
    assert privileges.may_read("alice", [(None, "t")])
    with pytest.raises(InsufficientPrivilege, match="must be owner of table t"):
        privileges.require_owner_of("alice", "table", None, "t")
    update = parse_statement("UPDATE t SET id = 2 WHERE id = 1")
    with pytest.raises(InsufficientPrivilege):
        privileges.require_write("alice", update, ("public", "t"))
    catalog.set_acl(table.id, grant(catalog.acl_of(table.id), "relation", owner="headrace", grantee="alice",
                                    letters="w"))
    privileges.require_write("alice", update, ("public", "t"))
    with pytest.raises(InsufficientPrivilege, match="permission denied for schema public"):
        privileges.require_create("alice")


def test_host_access_confines_directories_and_commands(tmp_path: Path) -> None:
    allowed, outside, data = tmp_path / "allowed", tmp_path / "outside", tmp_path / "allowed" / "data"
    for directory in (allowed, outside, data):
        directory.mkdir(parents=True, exist_ok=True)
    (allowed / "link").symlink_to(outside)
    access = HostAccess.from_options(["/usr/bin/driver --flag"], [str(allowed)], data)
    assert access.confine_directory(allowed / "new" / "set") == allowed / "new" / "set"
    for escape in (outside / "x", allowed / ".." / "outside", allowed / "link" / "x", data, data / "sinks" / "x",
                   allowed, tmp_path, Path("/"), Path("/etc/cron.d")):  # allowed itself holds the data directory
        with pytest.raises(HeadraceError) as refused:
            access.confine_directory(escape)
        assert refused.value.sqlstate == "42501"
    with pytest.raises(HeadraceError) as relative:
        access.confine_directory("relative/path")
    assert relative.value.sqlstate == "22023"
    assert HostAccess().directories == () and HostAccess().commands == ()
    with pytest.raises(HeadraceError):
        HostAccess().confine_directory(allowed)  # nothing allowed without --allow-directory
    access.check_command("  /usr/bin/driver --flag ")
    for command in ("/usr/bin/driver", "/usr/bin/driver --flag; rm -rf ~", "/usr/bin/driver --flag --other",
                    "sh -c '/usr/bin/driver --flag'"):
        with pytest.raises(HeadraceError) as denied:
            access.check_command(command)
        assert denied.value.sqlstate == "42501"
    assert os.path.realpath(allowed / "link") == str(outside)


@pytest.mark.parametrize(("sql", "expected"), [
    ("GRANT SELECT ON t TO alice", (False, ["SELECT"], "table", [(None, "t")], ["alice"])),
    ("GRANT ALL PRIVILEGES ON ALL TABLES IN SCHEMA public TO PUBLIC, bob",
     (False, ["ALL"], "all tables", [(None, "public")], ["", "bob"])),
    ("REVOKE insert, update ON TABLE public.t, u FROM \"Carol\" CASCADE",
     (True, ["INSERT", "UPDATE"], "table", [("public", "t"), (None, "u")], ["Carol"])),
    ("GRANT USAGE ON SECRET s TO alice", (False, ["USAGE"], "secret", [(None, "s")], ["alice"])),
    ("GRANT USAGE ON CONNECTION c TO alice", (False, ["USAGE"], "connection", [(None, "c")], ["alice"])),
    ("GRANT CREATE ON SCHEMA public TO alice", (False, ["CREATE"], "schema", [(None, "public")], ["alice"])),
    ("GRANT CREATE, TEMP ON DATABASE headrace TO alice",
     (False, ["CREATE", "TEMPORARY"], "database", [(None, "headrace")], ["alice"])),
])
def test_grant_grammar(sql: str, expected: tuple[object, ...]) -> None:
    args = parse_statement(sql).args
    assert (args["revoke"], args["privileges"], args["kind"], args["objects"], args["grantees"]) == expected


def test_grant_grammar_refuses_what_headrace_does_not_have() -> None:
    with pytest.raises(FeatureNotSupported):
        parse_statement("GRANT SELECT (id) ON t TO alice")
    with pytest.raises(FeatureNotSupported):
        parse_statement("GRANT USAGE ON SEQUENCE s TO alice")
    with pytest.raises(SyntaxError_):
        parse_statement("GRANT FLY ON t TO alice")
    assert parse_statement("GRANT SELECT ON t TO alice WITH GRANT OPTION").args["grant_option"] is True


@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_text('/etc/hostname')", "SELECT * FROM read_blob('x')", "SELECT * FROM read_csv('x')",
    "SELECT * FROM read_parquet('x')", "SELECT * FROM sniff_csv('x')", "SELECT * FROM query('SELECT 1')",
    "SELECT * FROM query_table('t')", "SELECT 1 FROM (SELECT 1) AS t, LATERAL read_text('x') AS r",
    "SELECT (SELECT count(*) FROM read_json_auto('x'))", "SELECT * FROM duckdb_tables()"])
def test_the_stores_file_and_sql_text_functions_are_refused(sql: str) -> None:
    from headrace.sql.select import plan_select

    with pytest.raises(HeadraceError) as refused:
        plan_select(parse_statement(sql), lambda schema, name: True)
    assert refused.value.sqlstate == "42883"  # as PostgreSQL answers a function it does not have
    plan_select(parse_statement("SELECT * FROM generate_series(1, 3) AS s(i)"), lambda schema, name: True)
