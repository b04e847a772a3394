"""Session-scoped Spark clusters from pyspark's own distribution (tests/scaleout/clusters.py), shared by every
scale-out test: a standalone master with two workers, and a Spark Connect server. Each is started the first time a
test asks for it and stopped at the end of the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.scaleout.clusters import ConnectServer, StandaloneCluster


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(tmp_path_factory.mktemp("standalone"))
    try:
        cluster.start(workers=2)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    server = ConnectServer(tmp_path_factory.mktemp("connect"))
    try:
        server.start()
        yield server
    finally:
        server.stop()
