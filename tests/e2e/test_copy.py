"""COPY through real clients: TO STDOUT in text, csv and binary (psycopg, asyncpg, psql and its
\\copy), and COPY FROM STDIN refused cleanly while there are no tables (the connection goes on)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from decimal import Decimal
from pathlib import Path

import asyncpg
import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess

pytestmark = pytest.mark.e2e

QUERY = "SELECT n, 'row ' || n AS label, CASE WHEN n = 2 THEN NULL ELSE n * 1.5 END AS half FROM generate_series(1, 3) AS t(n)"


def psql(server: HeadraceProcess, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", str(server.pg_port), "-U", "headrace", "headrace", "-X", *args],
        input=stdin, capture_output=True, text=True, timeout=30,
        env={"PGCONNECT_TIMEOUT": "5", "PATH": "/usr/bin:/bin"},
    )


def test_psycopg_copy_to_text_csv_binary(server: HeadraceProcess) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        cursor = conn.cursor()
        with cursor.copy(f"COPY ({QUERY}) TO STDOUT") as copy:
            text = b"".join(bytes(chunk) for chunk in copy)
        assert text == b"1\trow 1\t1.5\n2\trow 2\t\\N\n3\trow 3\t4.5\n"
        assert cursor.rowcount == 3
        with cursor.copy(f"COPY ({QUERY}) TO STDOUT WITH (FORMAT csv, HEADER, DELIMITER ';')") as copy:
            csv = b"".join(bytes(chunk) for chunk in copy)
        assert csv == b"n;label;half\n1;row 1;1.5\n2;row 2;\n3;row 3;4.5\n"
        with cursor.copy(f"COPY ({QUERY}) TO STDOUT (FORMAT binary)") as copy:
            copy.set_types(["int4", "text", "numeric"])  # PostgreSQL types n int4
            rows = list(copy.rows())
        assert [(n, label, None if half is None else float(half)) for n, label, half in rows] == [
            (1, "row 1", 1.5), (2, "row 2", None), (3, "row 3", 4.5)]
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_asyncpg_copy_from_query(server: HeadraceProcess) -> None:
    async def body() -> None:
        conn = await asyncpg.connect(host="127.0.0.1", port=server.pg_port, user="headrace", database="headrace")
        try:
            chunks: list[bytes] = []

            async def sink(chunk: bytes) -> None:
                chunks.append(bytes(chunk))

            status = await conn.copy_from_query(QUERY, output=sink, format="csv", header=True)
            assert status == "COPY 3"
            assert b"".join(chunks) == b"n,label,half\n1,row 1,1.5\n2,row 2,\n3,row 3,4.5\n"
        finally:
            await conn.close()

    asyncio.run(body())


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql not installed")
def test_psql_copy_to_stdout_and_backslash_copy(server: HeadraceProcess, tmp_path: Path) -> None:
    result = psql(server, "-c", f"COPY ({QUERY}) TO STDOUT WITH CSV HEADER")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "n,label,half\n1,row 1,1.5\n2,row 2,\n3,row 3,4.5\n"
    target = tmp_path / "out.bin"
    result = psql(server, "-c", f"\\copy ({QUERY}) to '{target}' with (format binary)")
    assert result.returncode == 0, result.stderr
    data = target.read_bytes()
    assert data.startswith(b"PGCOPY\n\xff\r\n\x00") and data.endswith(b"\xff\xff")
    target = tmp_path / "out.csv"
    result = psql(server, "-c", f"\\copy ({QUERY}) to '{target}' csv")
    assert result.returncode == 0, result.stderr
    assert target.read_text() == "1,row 1,1.5\n2,row 2,\n3,row 3,4.5\n"


def test_copy_from_stdin_is_refused_clearly_and_the_connection_goes_on(server: HeadraceProcess) -> None:
    name = f"copy_src_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SOURCE {name} FROM WEBHOOK BODY FORMAT JSON")
        with pytest.raises(psycopg.errors.WrongObjectType, match=f'"{name}" is not a table'):
            with conn.cursor().copy(f"COPY {name} FROM STDIN") as copy:
                copy.write(b'{"a": 1}\n')
        with pytest.raises(psycopg.errors.UndefinedTable):
            with conn.cursor().copy("COPY no_such_relation FROM STDIN WITH (FORMAT csv)") as copy:
                copy.write(b"1\n")
        assert conn.execute("SELECT 1").fetchone() == (1,)
        conn.execute(f"DROP SOURCE {name}")


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql not installed")
def test_psql_backslash_copy_from_into_a_source(server: HeadraceProcess, tmp_path: Path) -> None:
    name = f"copy_psql_{uuid.uuid4().hex[:6]}"
    data = tmp_path / "in.csv"
    data.write_text("1,a\n")
    script = (f"CREATE SOURCE {name} FROM WEBHOOK BODY FORMAT JSON;\n\\copy {name} from '{data}' csv\n"
              f"SELECT 'still here';\nDROP SOURCE {name};\n")
    result = psql(server, "-At", "-f", "-", stdin=script)
    assert f'"{name}" is not a table' in result.stderr
    assert "still here" in result.stdout


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql not installed")
def test_copy_from_stdin_into_a_table_only_the_store_keeps(server: HeadraceProcess, tmp_path: Path) -> None:
    """`serial` makes the table the store PostgreSQL's own (docs/store.md): COPY FROM STDIN goes to its COPY as
    the client sent it, in every format, and PostgreSQL's errors come back."""
    name = f"copy_kept_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id serial PRIMARY KEY, label name, amount numeric(6,2))")
        with conn.cursor().copy(f"COPY {name} (label, amount) FROM STDIN WITH (FORMAT csv)") as copy:
            copy.write(b"a,1.5\nb,\n")
        with conn.cursor().copy(f"COPY {name} (label, amount) FROM STDIN (FORMAT binary)") as copy:
            copy.set_types(["name", "numeric"])
            copy.write_row(("c", Decimal("2.25")))
        with pytest.raises(psycopg.errors.NumericValueOutOfRange):
            with conn.cursor().copy(f"COPY {name} (label, amount) FROM STDIN") as copy:
                copy.write(b"d\t123456\n")
        data = tmp_path / "in.txt"
        data.write_text("e\t3\n")
        result = psql(server, "-At", "-f", "-",
                      stdin=f"\\copy {name} (label, amount) from '{data}'\nSELECT 'still here';\n")
        assert result.returncode == 0 and "still here" in result.stdout, result.stderr
        assert conn.execute(f"SELECT id, label::text, amount::text FROM {name} ORDER BY id").fetchall() == [
            (1, "a", "1.50"), (2, "b", None), (3, "c", "2.25"), (4, "e", "3.00")]
        conn.execute(f"DROP TABLE {name}")
