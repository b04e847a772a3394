"""Fixtures for sink drivers: any Transactor (and Connector) served by the real connection loop on
127.0.0.1:<free port>, its event loop in a daemon thread (materialize/hosting.py), driven by a real `Runtime`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from headrace.materialize.driver import Connector, TransactorFactory
from headrace.materialize.hosting import ThreadedDriverServer

# A driver server for one test: `runtime(spec)` connects a new Runtime to it (a new connection each time, as after
# a restart).
HostedDriver = ThreadedDriverServer


@contextmanager
def hosted_driver(transactor_factory: TransactorFactory, connector: Connector | None = None) -> Iterator[HostedDriver]:
    host = HostedDriver(transactor_factory, connector, thread_name="hosted-driver")
    try:
        yield host
    finally:
        host.stop()
