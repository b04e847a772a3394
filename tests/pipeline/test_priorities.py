"""The pipeline's work yields the CPU to the server's requests: the pipeline process runs SCHED_IDLE (its JVM and
Python workers inherit it), the server's threads that apply its commits are slightly niced, and DuckDB leaves a core
to the event loop (pipeline/supervisor.py, server.py, store/serving.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from headrace.pipeline import supervisor
from headrace.server import APPLY_NICENESS, lower_apply_thread_priority
from headrace.store.serving import ServingStore, default_threads


def test_the_pipeline_process_and_its_children_run_sched_idle() -> None:
    assert supervisor.PIPELINE_PRIORITY == "idle"  # the default
    child = subprocess.run(  # a grandchild too: the JVM and its Python workers inherit the policy
        [sys.executable, "-c", "import os, subprocess, sys; print(os.sched_getscheduler(0), subprocess.run("
         "[sys.executable, '-c', 'import os; print(os.sched_getscheduler(0))'], capture_output=True, text=True)"
         ".stdout.strip())"],
        preexec_fn=supervisor._lower_priority, capture_output=True, text=True, check=True)
    assert child.stdout.split() == [str(os.SCHED_IDLE)] * 2


def test_commit_threads_are_niced_and_other_threads_are_not() -> None:
    seen: list[int] = []

    def apply() -> None:
        lower_apply_thread_priority()
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    thread = threading.Thread(target=apply)
    thread.start()
    thread.join()
    assert seen == [APPLY_NICENESS] and APPLY_NICENESS > 0
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 0  # a thread's niceness is its own


def test_duckdb_leaves_a_core_to_the_event_loop(tmp_path: Path) -> None:
    assert default_threads() == max(1, (os.cpu_count() or 2) - 1)
    for threads, expected in ((None, default_threads()), (3, 3)):
        store = ServingStore(tmp_path / f"store-{threads}.duckdb", threads=threads)
        try:
            assert store.cursor().execute("SELECT current_setting('threads')").fetchone() == (expected,)
        finally:
            store.close()
