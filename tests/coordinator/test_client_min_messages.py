"""client_min_messages filters the notices a statement sends, as PostgreSQL's does (coordinator/client.py)."""

from __future__ import annotations

import pytest

from headrace.coordinator.client import shown_notices
from headrace.coordinator.responses import CommandComplete
from headrace.errors import Notice

ALREADY = Notice("there is already a transaction in progress", "25001", "WARNING")
SKIPPING = 'table "t" does not exist, skipping'  # a plain text notice is a NOTICE
INFO = Notice("an info", "00000", "INFO")


@pytest.mark.parametrize(("setting", "kept"), [
    ("notice", (ALREADY, SKIPPING, INFO)),
    ("NOTICE", (ALREADY, SKIPPING, INFO)),
    ("debug1", (ALREADY, SKIPPING, INFO)),
    ("warning", (ALREADY, INFO)),
    ("error", (INFO,)),  # INFO is always sent
])
def test_notices_below_the_setting_are_not_sent(setting: str, kept: tuple[object, ...]) -> None:
    response = CommandComplete("BEGIN", (ALREADY, SKIPPING, INFO))
    assert shown_notices(response, setting).notices == kept
    assert shown_notices(response, setting).tag == "BEGIN"
