"""A session's temporary relations on the store PostgreSQL shadow headrace's of the same name (coordinator/
temp_relations.py): here with the DuckDB serving store and a real PostgreSQL 15 as the store, in process."""

from __future__ import annotations

import pytest

from headrace.coordinator.client import AdapterClient, SessionClient
from headrace.coordinator.responses import CommandComplete
from headrace.errors import HeadraceError
from tests.coordinator.test_passthrough import adapter, drive, rows, run  # noqa: F401 - the fixture

__all__ = ["adapter"]


def test_a_temporary_table_shadows_headraces(adapter: AdapterClient) -> None:  # noqa: F811 - the fixture
    async def body(session: SessionClient) -> None:
        await run(session, "CREATE TABLE shadowed (f1 float8)")
        coordinator = adapter._coordinator  # type: ignore[attr-defined]
        assert coordinator.catalog.find_table("public", "shadowed") is not None
        assert (await run(session, "CREATE TEMP TABLE shadowed (f1 float8)")).tag == "CREATE TABLE"
        inserted = await run(session, "INSERT INTO Shadowed VALUES ('   -34.84  '), ('1e+200')")
        assert isinstance(inserted, CommandComplete) and inserted.tag == "INSERT 0 2"  # PostgreSQL's, into pg_temp
        assert await rows(session, "SELECT f1 FROM shadowed ORDER BY f1") == [(b"-34.84",), (b"1e+200",)]
        # a write to headrace's table reading the temporary one is not the store's to run: refused as a mix
        with pytest.raises(HeadraceError) as mixed:
            await run(session, "INSERT INTO public.shadowed SELECT f1 FROM shadowed")
        assert mixed.value.sqlstate == "0A000"
        assert (await run(session, "DROP TABLE shadowed")).tag == "DROP TABLE"  # the temporary one
        assert coordinator.catalog.find_table("public", "shadowed") is not None
        with pytest.raises(HeadraceError) as gone:  # PostgreSQL's answer again: no temporary relation left
            await run(session, "SELECT * FROM pg_temp.shadowed")
        assert gone.value.sqlstate == "42P01"
    drive(adapter, body)


def test_a_statement_known_before_the_temporary_table_reads_it_after(adapter: AdapterClient) -> None:  # noqa: F811
    """The plan cache, the fast path's shapes and the store's routes remember statements by text: once the session
    may hold temporary relations, none of them may answer for a name a temporary relation now shadows."""
    async def body(session: SessionClient) -> None:
        await run(session, "CREATE TABLE known_first (k int PRIMARY KEY, f1 float8)")
        await run(session, "CREATE INDEX known_first_k ON known_first (k)")
        for _ in range(2):  # planned, then from the plan cache / the index's shape
            assert await rows(session, "SELECT f1 FROM known_first WHERE k = 1") == []
            assert await rows(session, "SELECT count(*) FROM known_first") in ([(0,)], [(b"0",)])
        await run(session, "CREATE TEMP TABLE known_first (k int, f1 float8)")
        await run(session, "INSERT INTO known_first VALUES (1, 2.5)")
        assert await rows(session, "SELECT f1 FROM known_first WHERE k = 1") == [(b"2.5",)]
        assert await rows(session, "SELECT count(*) FROM known_first") == [(b"1",)]
    drive(adapter, body)
