"""A session's backend connection reads a large result in chunks (libpq's chunked mode), against a real PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest

from headrace.errors import HeadraceError
from headrace.store.backend import BackendConnection, BackendResult

from ..real_servers.postgres import new_store_database


async def read_all(connection: BackendConnection, sql: str, chunk_rows: int) -> tuple[list[BackendResult], list]:
    pieces = [await connection.execute(sql, chunk_rows=chunk_rows)]
    while pieces[-1].more:
        pieces.append(await connection.next_chunk())
    return pieces, [row for piece in pieces for row in piece.rows]


def test_a_large_result_comes_in_chunks_and_the_connection_goes_on() -> None:
    async def scenario() -> None:
        connection = await BackendConnection.open(new_store_database("chunks"))
        try:
            pieces, rows = await read_all(connection, "SELECT g, 'x' || g FROM generate_series(1, 2500) g", 1000)
            assert [len(piece.rows) for piece in pieces] == [1000, 1000, 500, 0]
            assert [piece.more for piece in pieces] == [True, True, True, False]
            assert rows == [(str(n).encode(), f"x{n}".encode()) for n in range(1, 2501)]
            assert pieces[-1].tag == "SELECT 2500" and pieces[0].columns == pieces[-1].columns
            # A result shorter than a chunk, and a command: one piece each, as without chunks.
            small = await connection.execute("SELECT 1", chunk_rows=1000)
            assert (small.more, small.rows, small.tag) == (False, [(b"1",)], "SELECT 1")
            command = await connection.execute("SET work_mem = '8MB'", chunk_rows=1000)
            assert (command.more, command.columns, command.tag) == (False, None, "SET")
            assert (await connection.execute("SELECT 42")).rows == [(b"42",)]
        finally:
            connection.close()

    asyncio.run(scenario())


def test_an_error_after_some_chunks_is_postgresqls_and_leaves_the_connection_usable() -> None:
    async def scenario() -> None:
        connection = await BackendConnection.open(new_store_database("chunks"))
        try:
            result = await connection.execute("SELECT 10 / (3000 - g) FROM generate_series(1, 5000) g",
                                              chunk_rows=1000)
            assert result.more
            with pytest.raises(HeadraceError) as failed:
                while result.more:
                    result = await connection.next_chunk()
            assert failed.value.sqlstate == "22012"
            assert not connection.busy
            assert (await connection.execute("SELECT 'after'")).rows == [(b"after",)]
        finally:
            connection.close()

    asyncio.run(scenario())


def test_a_copy_to_stdout_is_refused_and_the_connection_stays_usable_in_chunked_mode() -> None:
    async def scenario() -> None:
        connection = await BackendConnection.open(new_store_database("chunks"))
        try:
            with pytest.raises(HeadraceError) as refused:
                await connection.execute("COPY (SELECT g FROM generate_series(1, 20000) g) TO STDOUT", chunk_rows=1000)
            assert refused.value.sqlstate == "0A000"
            assert (await connection.execute("SELECT 'after'", chunk_rows=1000)).rows == [(b"after",)]
        finally:
            connection.close()

    asyncio.run(scenario())
