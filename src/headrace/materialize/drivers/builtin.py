"""The built-in sink drivers by name: what `CREATE SINK ... INTO <driver>` and `headrace driver-test <driver>` run.

Each is a Connector (Spec / Validate / Apply) and a transactor factory (Open), served in process by the same
connection loop (materialize/driver.py) and protocol as an external driver, so the runtime cannot tell them apart.
`loads_columns`: the transactor answers columnar Loads (LoadColumns), so a sink may Load keys as one Arrow table.
`remote_authoritative`: the driver's store holds the checkpoint (Open returns it), so the runtime needs no recovery
log and may pipeline commits; every other driver is run with a recovery log."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from headrace.errors import InvalidParameterValue
from headrace.materialize.driver import Connector, TransactorFactory
from headrace.materialize.drivers.http import HttpConnector, HttpTransactor
from headrace.materialize.drivers.parquet import ParquetConnector, ParquetTransactor
from headrace.materialize.drivers.postgres import PostgresConnector, PostgresTransactor
from headrace.materialize.drivers.redis import RedisConnector, RedisTransactor


@dataclass(frozen=True)
class BuiltinDriver:
    name: str
    pattern: str  # the seed's commit pattern, for SHOW SINKS and the conformance kit's report
    connector: Callable[[], Connector]
    transactor_factory: TransactorFactory
    loads_columns: bool
    remote_authoritative: bool = False
    delta_only: bool = False
    exactly_once: bool = True


BUILTIN_DRIVERS: dict[str, BuiltinDriver] = {
    "postgres": BuiltinDriver("postgres", "remote store authoritative, fenced", PostgresConnector,
                              PostgresTransactor.factory, loads_columns=True, remote_authoritative=True),
    "redis": BuiltinDriver("redis", "recovery log, non-transactional store", RedisConnector,
                           lambda _open: RedisTransactor(), loads_columns=False, exactly_once=False),
    "parquet": BuiltinDriver("parquet", "recovery log, idempotent apply", ParquetConnector,
                             lambda _open: ParquetTransactor(), loads_columns=True),
    "http": BuiltinDriver("http", "delta updates, idempotency keys", HttpConnector,
                          lambda _open: HttpTransactor(), loads_columns=False, delta_only=True),  # exactly once
    # only into a receiver that deduplicates on Idempotency-Key (a webhook source with IDEMPOTENT on it)
}


def builtin_driver(name: str) -> BuiltinDriver:
    driver = BUILTIN_DRIVERS.get(name.lower())
    if driver is None:
        raise InvalidParameterValue(f"no built-in driver {name!r}", hint=f"drivers: {', '.join(BUILTIN_DRIVERS)}")
    return driver
