"""pgjdbc (Debian's libpostgresql-jdbc-java) against a real server: tests/e2e/jdbc/Smoke.java is
compiled with javac and run; it connects, reads DatabaseMetaData and runs a prepared query."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess

JAR = Path("/usr/share/java/postgresql.jar")
SOURCE = Path(__file__).parent / "jdbc" / "Smoke.java"
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("javac") is None or not JAR.exists(),
                       reason="needs javac and libpostgresql-jdbc-java (scripts/bootstrap.sh installs both)"),
]


def test_jdbc_metadata_and_prepared_query(server: HeadraceProcess, tmp_path: Path) -> None:
    name = f"jdbc_src_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SOURCE {name} FROM WEBHOOK BODY FORMAT JSON INCLUDE HEADERS IDEMPOTENT (body->>'id')")
    subprocess.run(["javac", "-d", str(tmp_path), "-cp", str(JAR), str(SOURCE)], check=True, timeout=120)
    result = subprocess.run(
        ["java", "-cp", f"{JAR}:{tmp_path}", "Smoke", f"jdbc:postgresql://127.0.0.1:{server.pg_port}/headrace", name],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "product PostgreSQL 15.0",
        f"table {name} TABLE",
        "column body jsonb 0",  # columnNoNulls
        "column headers jsonb 1",  # columnNullable
        "column received_at timestamptz 0",
        "column idempotency_key text 0",
        f"pk idempotency_key {name}_pkey",
        "answer 42 headrace",
    ]
