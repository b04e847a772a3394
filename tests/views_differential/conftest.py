"""A headrace server and a PostgreSQL 15 database holding the same tables: PostgreSQL is the oracle for every view."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.server_process import HeadraceProcess
from tests.real_servers.postgres import shared_cluster
from tests.views_differential.oracle import Pair

_databases = itertools.count(1)


@pytest.fixture(scope="session")
def views_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HeadraceProcess]:
    process = HeadraceProcess(Path(tmp_path_factory.mktemp("views-differential")) / "data")
    process.start()
    yield process
    process.stop()


@pytest.fixture()
def pair(views_server: HeadraceProcess) -> Iterator[Pair]:
    """A fresh PostgreSQL database (TimeZone UTC, as views compute timestamptz text) beside the shared server."""
    oracle_url = shared_cluster().create_database(f"oracle_{os.getpid()}_{next(_databases)}")
    connected = Pair.connect(views_server.dsn, oracle_url)
    try:
        yield connected
    finally:
        connected.close()
