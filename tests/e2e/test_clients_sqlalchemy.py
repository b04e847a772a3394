"""SQLAlchemy 2 with psycopg 3 (and asyncpg) against a real server: reflection through pg_catalog,
then a Core select with a where clause and a bound parameter."""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess, wait_for

sa = pytest.importorskip("sqlalchemy")
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def source(server: HeadraceProcess) -> str:
    name = f"sa_payments_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SOURCE {name} FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id')")
    for i in range(3):
        request = urllib.request.Request(server.webhook_url(name), method="POST",
                                         data=json.dumps({"id": f"p{i}", "customer": f"c{i}"}).encode())
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
    return name


def url(server: HeadraceProcess, driver: str) -> str:
    return f"postgresql+{driver}://headrace@127.0.0.1:{server.pg_port}/headrace"


def test_reflection(server: HeadraceProcess, source: str) -> None:
    engine = sa.create_engine(url(server, "psycopg"), isolation_level="AUTOCOMMIT")
    try:
        inspector = sa.inspect(engine)
        assert source in inspector.get_table_names()
        assert source not in inspector.get_view_names()
        columns = {column["name"]: column for column in inspector.get_columns(source)}
        assert list(columns) == ["body", "received_at", "idempotency_key"]
        assert isinstance(columns["body"]["type"], sa.dialects.postgresql.JSONB)
        assert isinstance(columns["received_at"]["type"], sa.TIMESTAMP) and columns["received_at"]["type"].timezone
        assert isinstance(columns["idempotency_key"]["type"], sa.Text)
        assert [columns[c]["nullable"] for c in columns] == [False, False, False]
        assert inspector.get_pk_constraint(source) == {
            "constrained_columns": ["idempotency_key"], "name": f"{source}_pkey", "comment": None,
            "dialect_options": {"postgresql_include": []}}
        assert inspector.get_indexes(source) == [] and inspector.get_foreign_keys(source) == []
    finally:
        engine.dispose()


def test_core_select_with_bound_parameter(server: HeadraceProcess, source: str) -> None:
    engine = sa.create_engine(url(server, "psycopg"), isolation_level="AUTOCOMMIT")
    try:
        table = sa.Table(source, sa.MetaData(), autoload_with=engine)
        query = (sa.select(table.c.idempotency_key, table.c.body["customer"].astext.label("customer"))
                 .where(table.c.idempotency_key == sa.bindparam("key")))
        with engine.connect() as conn:
            rows = wait_for(lambda: conn.execute(query, {"key": "p1"}).all(), timeout=90, message="row p1")
            assert [tuple(row) for row in rows] == [("p1", "c1")]  # type: ignore[union-attr]
            version = conn.execute(sa.text("select version()")).scalar_one()
            assert version.startswith("PostgreSQL 15.0 (headrace ")
    finally:
        engine.dispose()


def test_asyncpg_dialect_reflection(server: HeadraceProcess, source: str) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    async def reflect() -> list[str]:
        engine = create_async_engine(url(server, "asyncpg"), isolation_level="AUTOCOMMIT")
        try:
            async with engine.connect() as conn:
                return await conn.run_sync(lambda sync: sa.inspect(sync).get_table_names())
        finally:
            await engine.dispose()

    assert source in asyncio.run(reflect())


def test_reflection_inside_a_transaction(server: HeadraceProcess, source: str) -> None:
    engine = sa.create_engine(url(server, "psycopg"))
    try:
        assert source in sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()
