"""A PgConnection (the sans-I/O protocol machine) on an in-process coordinator, driven by feeding it bytes:
for tests and bench/pgwire_cpu.py, which need a real coordinator but no sockets or Spark."""

from __future__ import annotations

from headrace.coordinator.client import AdapterClient
from headrace.pgwire.connection import PgConnection
from tests.coordinator.conftest import fill_table_in_store
from tests.pgwire import wire_client as wc


async def drain(connection: PgConnection) -> bytes:
    """Step until more bytes are needed; everything written meanwhile."""
    while await connection.step() is not None:
        pass
    return connection.take_output()


async def connect(adapter: AdapterClient) -> PgConnection:
    connection = PgConnection(adapter, peer_address="127.0.0.1")
    connection.receive_data(wc.startup({"user": "headrace", "database": "headrace"}))
    await drain(connection)
    return connection


async def indexed_kv(adapter: AdapterClient, values_sql: str) -> PgConnection:
    """A connection to a coordinator whose table kv (k int PRIMARY KEY, v text) holds the (k, v) rows of the
    DuckDB query `values_sql` and is indexed on k; the rows go straight into the store as the serving driver
    writes a table's (there is no pipeline in process)."""
    connection = await connect(adapter)
    connection.receive_data(wc.query("CREATE TABLE kv (k int PRIMARY KEY, v text)"))
    assert b"CREATE TABLE" in await drain(connection)
    fill_table_in_store(adapter, values_sql)
    connection.receive_data(wc.query("CREATE INDEX kv_k ON kv (k)"))
    assert b"CREATE INDEX" in await drain(connection)
    return connection
