from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.server_process import HeadraceProcess


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HeadraceProcess]:
    """One shared server for the end-to-end tests that do not kill it."""
    process = HeadraceProcess(Path(tmp_path_factory.mktemp("shared")) / "data")
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def pg_serving_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HeadraceProcess]:
    """One shared server whose serving store is the store PostgreSQL (`--serving-store postgres`), for the tests of
    that mode; its sinks may write under the tests' base directory."""
    process = HeadraceProcess(Path(tmp_path_factory.mktemp("pgserving")) / "data",
                              ("--serving-store", "postgres", "--allow-directory", str(tmp_path_factory.getbasetemp())))
    process.start()
    yield process
    process.stop()
