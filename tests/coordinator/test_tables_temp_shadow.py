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
