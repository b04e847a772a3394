"""timestamptz in the session's TimeZone, as PostgreSQL does it: SET TimeZone / SHOW TimeZone, text values written
in that zone with its offset, binary values UTC microseconds whatever the zone; through psycopg (text and binary),
asyncpg (binary, and text through a text codec) and the HTTP SQL API."""

from __future__ import annotations

import asyncio
import datetime
import json
from typing import Any
from zoneinfo import ZoneInfo

import aiohttp
import asyncpg
import psycopg
import pytest
from psycopg.types.string import TextLoader

from tests.e2e.server_process import HeadraceProcess

pytestmark = pytest.mark.e2e

INSTANT = datetime.datetime(2024, 1, 15, 12, 0, 0, 250000, tzinfo=datetime.timezone.utc)
SUMMER = datetime.datetime(2024, 7, 1, 16, 0, tzinfo=datetime.timezone.utc)
QUERY = "SELECT '2024-01-15 12:00:00.25+00'::timestamptz AS winter, '2024-07-01 16:00:00+00'::timestamptz AS summer"


def test_psycopg_text_and_binary(server: HeadraceProcess) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        assert conn.execute("SHOW TimeZone").fetchone() == ("UTC",)
        conn.execute("SET TimeZone = 'america/new_york'")
        assert conn.execute("SHOW TimeZone").fetchone() == ("America/New_York",)
        assert conn.info.parameter_status("TimeZone") == "America/New_York"  # ParameterStatus after SET

        raw = conn.cursor()
        raw.adapters.register_loader("timestamptz", TextLoader)  # the wire text itself
        assert raw.execute(QUERY).fetchone() == ("2024-01-15 07:00:00.25-05", "2024-07-01 12:00:00-04")
        # prepared (extended protocol), text
        assert raw.execute(QUERY + " WHERE %s::int = 1", (1,), prepare=True).fetchone() == \
            ("2024-01-15 07:00:00.25-05", "2024-07-01 12:00:00-04")

        text_values = conn.execute(QUERY).fetchone()
        binary_values = conn.cursor(binary=True).execute(QUERY).fetchone()
        assert text_values == binary_values == (INSTANT, SUMMER)  # the same instants either way
        assert text_values is not None and text_values[0].utcoffset() == datetime.timedelta(hours=-5)

        # a text parameter without an offset is a local time of the session's zone
        assert conn.execute("SELECT %s::timestamptz", ("2024-01-15 07:00:00.25",)).fetchone() == (INSTANT,)

        conn.execute("SET TIME ZONE 'Asia/Kolkata'")
        assert raw.execute(QUERY).fetchone() == ("2024-01-15 17:30:00.25+05:30", "2024-07-01 21:30:00+05:30")
        conn.execute("RESET TimeZone")
        assert raw.execute(QUERY).fetchone() == ("2024-01-15 12:00:00.25+00", "2024-07-01 16:00:00+00")

        with pytest.raises(psycopg.Error) as bad:
            conn.execute("SET TimeZone = 'Mars/Olympus_Mons'")
        assert bad.value.sqlstate == "22023"


def test_set_local_reverts_at_commit(server: HeadraceProcess) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        raw = conn.cursor()
        raw.adapters.register_loader("timestamptz", TextLoader)
        conn.execute("BEGIN")
        conn.execute("SET LOCAL TimeZone = 'Europe/Amsterdam'")
        assert raw.execute(QUERY).fetchone() == ("2024-01-15 13:00:00.25+01", "2024-07-01 18:00:00+02")
        conn.execute("COMMIT")
        assert raw.execute(QUERY).fetchone() == ("2024-01-15 12:00:00.25+00", "2024-07-01 16:00:00+00")


def test_asyncpg_binary_and_text(server: HeadraceProcess) -> None:
    async def main() -> tuple[Any, Any, Any]:
        conn = await asyncpg.connect(host="127.0.0.1", port=server.pg_port, user="headrace", database="headrace",
                                     server_settings={"TimeZone": "America/New_York"})
        try:
            shown = await conn.fetchval("SHOW TimeZone")
            binary = await conn.fetchrow(QUERY)  # asyncpg reads timestamptz in binary: UTC
            await conn.set_type_codec("timestamptz", schema="pg_catalog", encoder=str, decoder=str, format="text")
            text = await conn.fetchrow(QUERY)
            return shown, tuple(binary), tuple(text)
        finally:
            await conn.close()

    shown, binary, text = asyncio.run(main())
    assert shown == "America/New_York"
    assert binary == (INSTANT, SUMMER)
    assert text == ("2024-01-15 07:00:00.25-05", "2024-07-01 12:00:00-04")


def test_http_sql_api(server: HeadraceProcess) -> None:
    async def main() -> Any:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"http://127.0.0.1:{server.http_port}/api/sql",
                                 json={"query": f"SET TimeZone = 'America/New_York'; {QUERY}"}) as response:
                assert response.status == 200
                return json.loads(await response.text())

    results = asyncio.run(main())["results"]
    assert results[-1]["rows"] == [["2024-01-15 07:00:00.25-05", "2024-07-01 12:00:00-04"]]
    # the values name their instants: parsed, they are the same moments
    parsed = [datetime.datetime.fromisoformat(v + ":00") for v in results[-1]["rows"][0]]
    assert parsed == [INSTANT, SUMMER]
    assert parsed[0].astimezone(ZoneInfo("America/New_York")).hour == 7
