"""The pipeline's work yields the CPU to the server's requests: the pipeline process runs SCHED_IDLE (its JVM and
Python workers inherit it), and DuckDB leaves a core to the event loop (pipeline/supervisor.py, store/serving.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from headrace.pipeline import supervisor
from headrace.store.serving import ServingStore, default_threads


def test_the_pipeline_process_and_its_children_run_sched_idle() -> None:
    assert supervisor.PIPELINE_PRIORITY == "idle"  # the default
    child = subprocess.run(  # a grandchild too: the JVM and its Python workers inherit the policy
        [sys.executable, "-c", "import os, subprocess, sys; print(os.sched_getscheduler(0), subprocess.run("
         "[sys.executable, '-c', 'import os; print(os.sched_getscheduler(0))'], capture_output=True, text=True)"
         ".stdout.strip())"],
        preexec_fn=supervisor._lower_priority, capture_output=True, text=True, check=True)
    assert child.stdout.split() == [str(os.SCHED_IDLE)] * 2


def test_duckdb_leaves_a_core_to_the_event_loop(tmp_path: Path) -> None:
    assert default_threads() == max(1, (os.cpu_count() or 2) - 1)
    for threads, expected in ((None, default_threads()), (3, 3)):
        store = ServingStore(tmp_path / f"store-{threads}.duckdb", threads=threads)
        try:
            assert store.cursor().execute("SELECT current_setting('threads')").fetchone() == (expected,)
        finally:
            store.close()
