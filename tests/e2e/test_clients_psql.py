"""psql 15 against a real server: its meta-commands send PostgreSQL-catalog queries (pg_class,
pg_attribute, format_type, OPERATOR(pg_catalog.~), ::regclass, ...) and print what they answer."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import psycopg
import pytest

from tests.e2e.server_process import SERVING_ON_POSTGRES, HeadraceProcess

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed (scripts/bootstrap.sh)")]


@pytest.fixture(scope="module")
def sources(server: HeadraceProcess) -> tuple[str, str]:
    keyed, plain = f"psql_keyed_{uuid.uuid4().hex[:6]}", f"psql_plain_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SOURCE {keyed} FROM WEBHOOK BODY FORMAT JSON INCLUDE HEADERS "
                     "IDEMPOTENT (headers->>'idempotency-key')")
        conn.execute(f"CREATE SOURCE {plain} FROM WEBHOOK BODY FORMAT JSON")
    return keyed, plain


def table_rows(output: str) -> list[list[str]]:
    """psql's table output as rows of stripped cells: column widths depend on every row listed (a shared server
    holds other tests' relations too)."""
    return [[cell.strip() for cell in line.split("|")] for line in output.splitlines() if "|" in line]


def psql(server: HeadraceProcess, *commands: str) -> str:
    env = {**os.environ, "PGHOST": "127.0.0.1", "PGPORT": str(server.pg_port), "PGUSER": "headrace",
           "PGDATABASE": "headrace", "PSQLRC": "/dev/null", "PGCONNECT_TIMEOUT": "10"}
    arguments = ["psql", "-X", "-v", "ON_ERROR_STOP=1"]
    for command in commands:
        arguments += ["-c", command]
    result = subprocess.run(arguments, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "ERROR" not in result.stderr, result.stderr
    return result.stdout + result.stderr  # "Did not find any relations." goes to stderr


def test_list_relations(server: HeadraceProcess, sources: tuple[str, str]) -> None:
    keyed, plain = sources
    for command in (r"\d", r"\dt"):
        output = psql(server, command)
        assert ["public", keyed, "table", "headrace"] in table_rows(output)
        assert ["public", plain, "table", "headrace"] in table_rows(output)
    assert keyed not in psql(server, r"\dv") and keyed not in psql(server, r"\dm")


def test_describe_source_with_primary_key(server: HeadraceProcess, sources: tuple[str, str]) -> None:
    keyed, _ = sources
    output = psql(server, rf"\d {keyed}")
    assert f'Table "public.{keyed}"' in output
    lines = {line.split("|")[0].strip(): [cell.strip() for cell in line.split("|")] for line in output.splitlines()
             if "|" in line}
    assert lines["body"][1:4] == ["jsonb", "", "not null"]
    assert lines["headers"][1:4] == ["jsonb", "", ""]
    assert lines["received_at"][1:4] == ["timestamp with time zone", "", "not null"]
    assert lines["idempotency_key"][1:4] == ["text", "", "not null"]
    assert f'"{keyed}_pkey" PRIMARY KEY, btree (idempotency_key)' in output


def test_describe_plus_and_index_list(server: HeadraceProcess, sources: tuple[str, str]) -> None:
    keyed, plain = sources
    output = psql(server, rf"\d+ {plain}")
    assert "Storage" in output and "Access method: heap" in output and "Indexes:" not in output
    assert ["public", f"{keyed}_pkey", "index", "headrace", keyed] in table_rows(psql(server, r"\di"))
    assert ["public", keyed, "table", "headrace", "permanent", "heap"] in [
        row[:6] for row in table_rows(psql(server, r"\dt+"))]


def test_schemas_databases_roles_conninfo(server: HeadraceProcess) -> None:
    if SERVING_ON_POSTGRES:  # PostgreSQL's own catalog: its schema owner, the store's database, mirrored roles
        assert " public            | pg_database_owner" in psql(server, r"\dn")
        database = psql(server, "SELECT current_database()").split("\n")[2].strip()
        assert f" {database} " in psql(server, r"\l")
        # a headrace superuser is never a superuser of the store PostgreSQL (docs/store.md, roles)
        assert " headrace " in psql(server, r"\du")
    else:
        assert " public | headrace" in psql(server, r"\dn")
        databases = psql(server, r"\l")
        assert " headrace | headrace | UTF8" in databases
        roles = psql(server, r"\du")
        assert " headrace  | Superuser, Create role, Create DB" in roles
    assert f'as user "headrace" on host "127.0.0.1" at port "{server.pg_port}"' in psql(server, r"\conninfo")


def test_expanded_output_and_builtins(server: HeadraceProcess) -> None:
    output = psql(server, r"\x on", "SELECT version(), current_setting('server_version') AS v, "
                  "current_user, current_database(), 7 / 2 AS half")
    assert "version          | PostgreSQL 15.0 (headrace " in output
    assert "v                | 15.0" in output
    assert "current_user     | headrace" in output
    assert "half             | 3" in output


def test_division_by_zero_is_22012(server: HeadraceProcess) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 5 % 0")
