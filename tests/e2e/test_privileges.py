"""Privileges end to end (issue 20): a real server, real clients (psycopg, psql, the HTTP SQL API), a login role
without privileges refused each action with 42501, grants making each work, revokes taking it away again; owners;
DROP ROLE of an owner; and the allow-lists confining EXTERNAL (COMMAND) and PARQUET (PATH), symlink and `..`
escapes included, at CREATE and again in the drivers (a catalog edited behind the server's back)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.e2e.server_process import SERVING_ON_POSTGRES, HeadraceProcess, wait_for

pytestmark = pytest.mark.e2e
REPOSITORY = Path(__file__).resolve().parents[2]
DRIVER_COMMAND = f"{sys.executable} {REPOSITORY / 'examples/drivers/jsonl/driver.py'}"


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = Path(tmp_path_factory.mktemp("host"))
    (root / "allowed").mkdir()
    (root / "outside").mkdir()
    (root / "allowed" / "escape").symlink_to(root / "outside")  # a symlink inside the allowed directory
    return root


@pytest.fixture(scope="module")
def server(host: Path) -> Iterator[HeadraceProcess]:
    process = HeadraceProcess(host / "data", ["--allow-directory", str(host / "allowed"),
                                              "--allow-command", DRIVER_COMMAND])
    process.start(timeout=120)
    yield process
    process.stop()


def connect(server: HeadraceProcess, user: str = "headrace") -> psycopg.Connection[Any]:
    return psycopg.connect(server.dsn.replace("user=headrace", f"user={user}"), autocommit=True)


@pytest.fixture(scope="module")
def admin(server: HeadraceProcess) -> Iterator[psycopg.Connection[Any]]:
    with connect(server) as conn:
        conn.execute("CREATE ROLE alice LOGIN")
        conn.execute("CREATE ROLE bob LOGIN")
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance int)")
        conn.execute("INSERT INTO accounts VALUES (1, 'a', 10), (2, 'b', 20)")
        conn.execute("CREATE INDEX accounts_by_id ON accounts (id)")
        conn.execute("CREATE MATERIALIZED VIEW totals AS SELECT owner, sum(balance) AS balance FROM accounts "
                     "GROUP BY owner")
        conn.execute("CREATE SECRET hook_key AS 'k'")
        conn.execute("CREATE SOURCE hooks FROM WEBHOOK BODY FORMAT JSON CHECK (WITH (BODY, SECRET hook_key) true)")
        conn.execute("CREATE CONNECTION warehouse TO POSTGRES (URL = 'postgresql://nobody@127.0.0.1:1/none')")
        wait_for(lambda: _readable(conn, "SELECT count(*) FROM accounts"), 300, message="the table is applied")
        yield conn


def _readable(conn: psycopg.Connection[Any], statement: str) -> bool:
    try:
        conn.execute(statement)
        return True
    except psycopg.errors.CannotConnectNow:  # the pipeline is still starting
        return False


@pytest.fixture()
def alice(server: HeadraceProcess, admin: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    with connect(server, "alice") as conn:
        yield conn


def refused(conn: psycopg.Connection[Any], statement: str, message: str | None = None, **kwargs: Any) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as raised:
        conn.execute(statement, **kwargs)
    if message is not None:
        assert raised.value.diag.message_primary == message


def test_a_role_without_privileges_is_refused_each_action(server: HeadraceProcess, alice: psycopg.Connection[Any],
                                                          host: Path) -> None:
    assert alice.info.parameter_status("is_superuser") == "off"
    with pytest.raises(psycopg.OperationalError, match='role "mallory" does not exist'):
        connect(server, "mallory")  # trust lets anyone in on loopback, but only as a role that exists
    refused(alice, "SELECT * FROM accounts", "permission denied for table accounts")
    refused(alice, "SELECT * FROM accounts WHERE id = 1")  # an index lookup (fast path), simple protocol
    refused(alice, "SELECT * FROM accounts WHERE id = %s", params=[1], prepare=True)  # and extended
    refused(alice, "SELECT 1 WHERE EXISTS (SELECT 1 FROM accounts)")
    refused(alice, "WITH a AS (SELECT * FROM accounts) SELECT count(*) FROM a")
    refused(alice, "SELECT * FROM totals", "permission denied for materialized view totals")
    refused(alice, "SELECT * FROM hooks", "permission denied for source hooks")
    refused(alice, "INSERT INTO accounts VALUES (3, 'c', 1)")
    refused(alice, "UPDATE accounts SET balance = 0")
    refused(alice, "DELETE FROM accounts WHERE id = 1")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        with alice.cursor().copy("COPY accounts TO STDOUT") as copy:
            list(copy)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        with alice.cursor().copy("COPY accounts FROM STDIN") as copy:
            copy.write_row((9, "z", 0))
    alice.execute("BEGIN")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        alice.execute("DECLARE c CURSOR FOR SUBSCRIBE accounts")
        alice.execute("FETCH 1 c")
    alice.execute("ROLLBACK")
    refused(alice, "DROP TABLE accounts", "must be owner of table accounts")
    refused(alice, "DROP MATERIALIZED VIEW totals", "must be owner of materialized view totals")
    refused(alice, "DROP SOURCE hooks", "must be owner of source hooks")
    refused(alice, "DROP INDEX accounts_by_id", "must be owner of index accounts_by_id")
    refused(alice, "CREATE INDEX alices ON accounts (owner)", "must be owner of table accounts")
    refused(alice, "ALTER SECRET hook_key AS 'stolen'", "must be owner of secret hook_key")
    refused(alice, "DROP SECRET hook_key", "must be owner of secret hook_key")
    refused(alice, "DROP CONNECTION warehouse", "must be owner of connection warehouse")
    refused(alice, "ALTER SOURCE hooks SET (WINDOW = '1 hour')", "must be owner of source hooks")
    refused(alice, "CREATE TABLE mine (id int PRIMARY KEY)", "permission denied for schema public")
    refused(alice, "CREATE SECRET mine AS 'x'", "permission denied for schema public")
    refused(alice, "GRANT SELECT ON accounts TO alice", "permission denied for table accounts")
    notices: list[str] = []
    alice.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
    alice.execute("GRANT CREATE ON SCHEMA public TO alice")  # PUBLIC has USAGE: warned, as PostgreSQL does
    assert notices == ['no privileges were granted for "public"']
    refused(alice, "CREATE TABLE mine (id int PRIMARY KEY)", "permission denied for schema public")
    refused(alice, f"CREATE SINK out FROM accounts INTO PARQUET (PATH '{host / 'allowed' / 'a'}')",
            "permission denied to create PARQUET sinks")
    refused(alice, f"CREATE SINK out FROM accounts INTO EXTERNAL (COMMAND '{DRIVER_COMMAND}')",
            "permission denied to create EXTERNAL sinks")
    refused(alice, "CREATE SINK out FROM accounts INTO EXTERNAL (ADDRESS '127.0.0.1:1')")
    assert not list((host / "allowed").glob("a*")), "nothing was written"
    # The store's file readers and SQL-text runners would read secrets.json or any relation: refused to everyone.
    for statement in (f"SELECT * FROM read_text('{host / 'data' / 'secrets.json'}')",
                      "SELECT * FROM query('SELECT * FROM accounts')"):
        with pytest.raises(psycopg.errors.UndefinedFunction):  # 42883: PostgreSQL has no such function
            alice.execute(statement)


def test_the_http_sql_api_checks_the_same_privileges(server: HeadraceProcess,
                                                      admin: psycopg.Connection[Any]) -> None:
    def post(user: str, query: str) -> dict[str, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.http_port}/api/sql", data=json.dumps({"query": query}).encode(),
            headers={"Content-Type": "application/json",
                     "Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode()})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]

    assert post("bob", "SELECT * FROM accounts")["results"][0]["error"]["code"] == "42501"
    assert post("bob", "DROP TABLE accounts")["results"][0]["error"]["code"] == "42501"
    assert post("headrace", "SELECT count(*) FROM accounts")["results"][0]["rows"] == [["2"]]


def test_grants_make_each_action_work_and_revoke_takes_it_away(server: HeadraceProcess,
                                                                admin: psycopg.Connection[Any],
                                                                alice: psycopg.Connection[Any]) -> None:
    admin.execute("GRANT SELECT ON accounts TO alice")
    assert alice.execute("SELECT count(*) FROM accounts").fetchone() == (2,)
    assert alice.execute("SELECT balance FROM accounts WHERE id = %s", [1], prepare=True).fetchone() == (10,)
    refused(alice, "INSERT INTO accounts VALUES (3, 'c', 30)")
    refused(alice, "SELECT * FROM totals")  # a grant on one relation is not one on another
    admin.execute("GRANT INSERT, UPDATE, DELETE ON TABLE accounts TO alice")
    alice.execute("INSERT INTO accounts VALUES (3, 'c', 30)")
    alice.execute("UPDATE accounts SET balance = 31 WHERE id = 3")
    alice.execute("DELETE FROM accounts WHERE id = 3")
    with alice.cursor().copy("COPY accounts FROM STDIN") as copy:
        copy.write_row((4, "d", 40))
    alice.execute("DELETE FROM accounts WHERE id = 4")
    admin.execute("REVOKE SELECT ON accounts FROM alice")
    refused(alice, "SELECT count(*) FROM accounts")
    refused(alice, "SELECT balance FROM accounts WHERE id = %s", params=[1], prepare=True)
    refused(alice, "UPDATE accounts SET balance = 0 WHERE id = 1")  # reads rows: needs SELECT as well
    refused(alice, "DELETE FROM accounts WHERE id = 1")
    alice.execute("INSERT INTO accounts VALUES (5, 'e', 50)")  # INSERT alone needs no SELECT
    admin.execute("DELETE FROM accounts WHERE id = 5")
    admin.execute("REVOKE ALL ON accounts FROM alice")
    refused(alice, "INSERT INTO accounts VALUES (6, 'f', 60)")

    admin.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO PUBLIC")
    with connect(server, "bob") as bob:
        assert bob.execute("SELECT count(*) FROM totals").fetchone() is not None
        assert bob.execute("SELECT count(*) FROM hooks").fetchone() == (0,)
    admin.execute("REVOKE SELECT ON ALL TABLES IN SCHEMA public FROM PUBLIC")
    refused(alice, "SELECT * FROM hooks")

    admin.execute("GRANT INSERT ON hooks TO alice")  # granted as PostgreSQL grants it; a source is still not written
    with pytest.raises(psycopg.Error) as not_a_table:
        alice.execute("INSERT INTO hooks (body) VALUES ('{}')")
    assert not_a_table.value.sqlstate != "42501"
    admin.execute("REVOKE INSERT ON hooks FROM alice")
    for statement in (f"SELECT * FROM read_blob('{server.data_dir / 'secrets.json'}')",
                      "SELECT * FROM query_table('accounts')"):
        with pytest.raises(psycopg.errors.UndefinedFunction):  # superusers too: headrace does not offer them
            admin.execute(statement)

    with pytest.raises(psycopg.errors.InvalidGrantOperation):
        admin.execute("GRANT USAGE ON accounts TO alice")  # PostgreSQL: invalid privilege type USAGE for table
    with pytest.raises(psycopg.errors.FeatureNotSupported):
        admin.execute("GRANT SELECT ON accounts TO alice WITH GRANT OPTION")
    with pytest.raises(psycopg.errors.UndefinedObject):
        admin.execute("GRANT SELECT ON accounts TO nobody")
    with pytest.raises(psycopg.errors.UndefinedTable):
        admin.execute("GRANT SELECT ON no_such_table TO alice")


def test_create_on_schema_public_makes_the_creator_the_owner(server: HeadraceProcess,
                                                              admin: psycopg.Connection[Any],
                                                              alice: psycopg.Connection[Any]) -> None:
    admin.execute("GRANT CREATE ON SCHEMA public TO alice")
    alice.execute("CREATE TABLE notes (id int PRIMARY KEY, body text)")
    alice.execute("INSERT INTO notes VALUES (1, 'mine')")  # the owner holds every privilege
    refused(alice, "CREATE SOURCE signed FROM WEBHOOK BODY FORMAT JSON CHECK (WITH (BODY, SECRET hook_key) true)",
            "permission denied for secret hook_key")
    admin.execute("GRANT USAGE ON SECRET hook_key TO alice")
    alice.execute("CREATE SOURCE signed FROM WEBHOOK BODY FORMAT JSON CHECK (WITH (BODY, SECRET hook_key) true)")
    refused(alice, "CREATE MATERIALIZED VIEW copied AS SELECT id FROM accounts",
            "permission denied for table accounts")  # a view needs SELECT on what it reads
    owners = dict(admin.execute("SELECT c.relname, r.rolname FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner "
                                "WHERE c.relname IN ('notes', 'accounts')").fetchall())
    assert owners == {"notes": "alice", "accounts": "headrace"}
    with connect(server, "bob") as bob:
        refused(bob, "DROP TABLE notes", "must be owner of table notes")
        refused(bob, "INSERT INTO notes VALUES (2, 'theirs')")
    alice.execute("GRANT SELECT ON notes TO bob")  # an owner grants on its own objects
    with pytest.raises(psycopg.errors.DependentObjectsStillExist) as dependent:
        admin.execute("DROP ROLE alice")
    assert "owner of table notes" in (dependent.value.diag.message_detail or "")
    alice.execute("DROP SOURCE signed")
    alice.execute("DROP TABLE notes")
    admin.execute("REVOKE USAGE ON SECRET hook_key FROM alice")
    admin.execute("REVOKE CREATE ON SCHEMA public FROM alice")
    refused(alice, "CREATE TABLE again (id int PRIMARY KEY)", "permission denied for schema public")


def test_has_privilege_functions_and_psql_dp(server: HeadraceProcess, admin: psycopg.Connection[Any],
                                             alice: psycopg.Connection[Any]) -> None:
    admin.execute("GRANT SELECT, INSERT ON accounts TO alice")
    if SERVING_ON_POSTGRES:
        # PostgreSQL's catalog answers, and its ACLs hold SELECT only: writes go through headrace, which checks
        # INSERT / UPDATE / DELETE itself (docs/store.md, "Owned by their creators")
        try:
            assert admin.execute(
                "SELECT has_table_privilege('alice', 'accounts', 'SELECT'), has_table_privilege('alice', 'totals', "
                "'SELECT'), has_database_privilege('alice', current_database(), 'CONNECT'), "
                "has_table_privilege('alice', 'pg_class', 'SELECT')").fetchone() == (True, False, True, True)
            acl = admin.execute("SELECT array_to_string(relacl, ',') FROM pg_class WHERE relname = 'accounts'"
                                ).fetchone()
            assert acl is not None and "alice=r/headrace" in acl[0].split(","), acl
            alice.execute("INSERT INTO accounts SELECT * FROM accounts WHERE false")  # headrace's INSERT grant
        finally:
            admin.execute("REVOKE ALL ON accounts FROM alice")
        return
    try:
        assert admin.execute(
            "SELECT has_table_privilege('alice', 'accounts', 'SELECT'), "
            "has_table_privilege('alice', 'public.accounts', 'UPDATE'), "
            "has_table_privilege('alice', 'totals', 'SELECT'), has_schema_privilege('alice', 'public', 'CREATE'), "
            "has_schema_privilege('alice', 'public', 'USAGE'), has_database_privilege('alice', 'headrace', 'CONNECT'), "
            "has_table_privilege('headrace', 'accounts', 'DELETE'), has_table_privilege('alice', 'pg_class', 'SELECT')"
        ).fetchone() == (True, False, False, False, True, True, True, True)
        with pytest.raises(psycopg.errors.UndefinedObject):
            admin.execute("SELECT has_table_privilege('nobody', 'accounts', 'SELECT')")
        assert alice.execute("SELECT has_table_privilege('accounts', 'select'), "
                             "has_table_privilege('accounts', 'delete')").fetchone() == (True, False)
        acl = admin.execute("SELECT array_to_string(relacl, ',') FROM pg_class WHERE relname = 'accounts'").fetchone()
        assert acl == ("headrace=arwdDxt/headrace,alice=ar/headrace",)
        if shutil.which("psql") is not None:
            env = {**os.environ, "PGHOST": "127.0.0.1", "PGPORT": str(server.pg_port), "PGUSER": "headrace",
                   "PGDATABASE": "headrace", "PSQLRC": "/dev/null", "PGCONNECT_TIMEOUT": "10"}
            result = subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=1", "-c", r"\dp accounts"], env=env,
                                    capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, result.stderr
            assert "headrace=arwdDxt/headrace" in result.stdout and "alice=ar/headrace" in result.stdout
    finally:
        admin.execute("REVOKE ALL ON accounts FROM alice")


def test_allow_lists_confine_parquet_paths_and_commands(admin: psycopg.Connection[Any], host: Path) -> None:
    allowed, outside = host / "allowed", host / "outside"
    for path in (outside / "p", allowed / ".." / "outside" / "p", allowed / "escape" / "p", host / "data" / "p",
                 host / "data" / "sinks" / "p", Path("/etc/headrace-sink")):
        refused(admin, f"CREATE SINK escaped FROM accounts INTO PARQUET (PATH '{path}')")
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        admin.execute("CREATE SINK escaped FROM accounts INTO PARQUET (PATH 'relative/p')")
    refused(admin, "CREATE SINK shell FROM accounts INTO EXTERNAL (COMMAND 'touch /tmp/headrace-pwned')")
    refused(admin, f"CREATE SINK shell FROM accounts INTO EXTERNAL (COMMAND '{DRIVER_COMMAND}; touch /tmp/x')")
    assert not list(outside.iterdir()) and not (host / "data" / "p").exists()

    admin.execute(f"CREATE SINK confined FROM accounts INTO PARQUET (PATH '{allowed / 'accounts'}', BUCKETS 2)")
    wait_for(lambda: (allowed / "accounts" / "_manifest.json").exists(), 120, message="the dataset")
    config = json.dumps({"directory": str(allowed)})
    admin.execute(f"CREATE SINK jsonl FROM accounts INTO EXTERNAL (COMMAND '{DRIVER_COMMAND}', CONFIG '{config}', "
                  "RESOURCE 'accounts')")
    wait_for(lambda: (allowed / "accounts.jsonl").exists(), 120, message="the allowed command ran")
    admin.execute("DROP SINK jsonl")
    admin.execute("DROP SINK confined")


def test_an_edited_catalog_cannot_bypass_the_allow_lists(tmp_path: Path) -> None:
    """Sinks recorded outside the lists (an older version's catalog, an edit) are refused by the drivers at start;
    and a catalog without owners (before privileges existed) keeps working, owned by the bootstrap superuser."""
    outside = tmp_path / "outside"
    marker = tmp_path / "pwned"
    process = HeadraceProcess(tmp_path / "data", ["--allow-directory", str(tmp_path / "allowed")])
    process.start(timeout=120)
    try:
        with connect(process) as conn:
            conn.execute("CREATE TABLE kept (id int PRIMARY KEY)")
            conn.execute("INSERT INTO kept VALUES (1), (2)")
            conn.execute("CREATE ROLE carol LOGIN")
            # No wait for the pipeline to apply the rows: acknowledged, they are in the table's log, which the
            # restart applies (the count below), and this server's Spark start would only cost time.
    finally:
        process.stop()
    catalog_path = tmp_path / "data" / "catalog.json"
    catalog = json.loads(catalog_path.read_text())
    for key in ("privileges", "schema_acl", "database_acl"):
        catalog.pop(key, None)  # as a catalog written before privileges existed
    table_id = catalog["tables"][0]["id"]
    next_id = int(catalog["next_id"])
    catalog["sinks"] = [
        {"id": f"u{next_id}", "name": "planted_pq",
         "create_sql": f"CREATE SINK planted_pq FROM kept INTO PARQUET (PATH '{outside}')"},
        {"id": f"u{next_id + 1}", "name": "planted_cmd",
         "create_sql": f"CREATE SINK planted_cmd FROM kept INTO EXTERNAL (COMMAND 'touch {marker}')"}]
    catalog["next_id"] = next_id + 2
    catalog_path.write_text(json.dumps(catalog))
    assert table_id
    process.start(timeout=120)
    try:
        with connect(process) as conn:
            wait_for(lambda: _readable(conn, "SELECT 1 FROM kept"), 300, message="the table is applied")
            assert conn.execute("SELECT count(*) FROM kept").fetchone() == (2,)
            owner = conn.execute("SELECT r.rolname FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner "
                                 "WHERE c.relname = 'kept'").fetchone()
            assert owner == ("headrace",)
            with connect(process, "carol") as carol:
                refused(carol, "DROP TABLE kept", "must be owner of table kept")
                refused(carol, "SELECT * FROM kept")
        assert not outside.exists() and not marker.exists()
        assert "permission denied" in process.output()
    finally:
        process.stop()
