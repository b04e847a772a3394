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
