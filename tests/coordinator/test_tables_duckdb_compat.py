"""The same table statements on the DuckDB serving store (the default): multiple-column SET, SET col = DEFAULT,
TRUNCATE, INSERT with a column list and fewer values, an upsert setting its key to its own value; UPDATE ... FROM
stays refused there (docs/tables.md). No pipeline runs: writes read each other through the overlay."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from headrace.catalog.catalog import Catalog
from headrace.coordinator.responses import CommandComplete, SendingRows
from headrace.coordinator.session import Session, default_variables
from headrace.coordinator.tables import Tables
from headrace.errors import HeadraceError
from headrace.sql.ddl import item_from_create_sql
from headrace.sql.parser import parse_statement
from headrace.store.serving import ServingStore


def test_table_statements_on_duckdb(tmp_path: Path) -> None:
    async def scenario() -> None:
        executor = ThreadPoolExecutor(4)
        catalog = Catalog(tmp_path, item_from_create_sql)
        tables = Tables(catalog, ServingStore(tmp_path / "store.duckdb"), executor, tmp_path, asyncio.Lock(),
                        lambda: None, lambda schema, name: catalog.find_table(schema, name) is not None)
        await tables.open_all()
        session = Session(user="headrace", database="headrace", variables=default_variables("headrace", "h", "t"))

        async def run(sql: str) -> Any:
            return await tables.execute(session, parse_statement(sql), sql, ())

        try:
            await run("CREATE TABLE u (k int PRIMARY KEY, a int, b int DEFAULT 7, c text)")
            await run("INSERT INTO u VALUES (1, 10, 20, 'foo'), (2, 11, 21, 'bar')")
            await run("UPDATE u SET (c, b) = ('car', a + b), a = a + 1 WHERE k = 1")
            await run("UPDATE u SET (a, b) = (SELECT b, a FROM u s WHERE s.k = 2) WHERE k = 2")
            swapped = await run("UPDATE u SET c = c WHERE k = 2 RETURNING a, b")
            assert isinstance(swapped, SendingRows) and swapped.rows == [(21, 11)]
            await run("UPDATE u SET (a, b) = ROW(DEFAULT, DEFAULT) WHERE k = 2")
            result = await run("UPDATE u SET c = c RETURNING k, a, b, c")
            assert isinstance(result, SendingRows) and sorted(result.rows) == [(1, 11, 30, "car"), (2, None, 7, "bar")]
            assert await run("INSERT INTO u VALUES (2, 0) ON CONFLICT (k) DO UPDATE SET (k, a) = (2, 5)") == \
                CommandComplete("INSERT 0 1")
            for statement, sqlstate in (("UPDATE u SET a = v.i FROM (VALUES (1)) AS v(i)", "0A000"),
                                        ("INSERT INTO u (k, a, b) VALUES (3, 1)", "42601"),
                                        ("INSERT INTO u VALUES (2) ON CONFLICT (k) DO UPDATE SET k = 9", "0A000"),
                                        ("UPDATE u SET (a, b) = (SELECT 1)", "42601")):
                with pytest.raises(HeadraceError) as caught:
                    await run(statement)
                assert caught.value.sqlstate == sqlstate, statement
            assert await run("TRUNCATE TABLE u") == CommandComplete("TRUNCATE TABLE")
            assert await run("DELETE FROM u") == CommandComplete("DELETE 0")
        finally:
            await tables.close_all()
            executor.shutdown()

    asyncio.run(scenario())
