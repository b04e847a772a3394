"""The test harness's own process handling (server_process.py), without a server: kill9 must not return while a
process of the group can still hold a file, lock or port."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from tests.e2e.server_process import live_group_members


def test_live_group_members_lists_the_group_until_each_process_has_exited() -> None:
    # a group leader whose two children it does not wait for once killed: they are reparented to PID 1
    leader = subprocess.Popen(["bash", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(live_group_members(leader.pid)) < 3:
            assert time.monotonic() < deadline, live_group_members(leader.pid)
            time.sleep(0.02)
        members = live_group_members(leader.pid)
        assert leader.pid in members and len(members) == 3
        assert live_group_members(os.getpgrp()) and leader.pid not in live_group_members(os.getpgrp())
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
    deadline = time.monotonic() + 5
    while live_group_members(leader.pid):
        assert time.monotonic() < deadline, "killed processes still listed as live"
        time.sleep(0.02)
