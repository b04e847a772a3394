"""server._freeze_after_warm_up: what the first requests built once is moved out of the collector's full passes."""

from __future__ import annotations

import asyncio
import gc
import weakref

from headrace.server import _freeze_after_warm_up


class _Node:
    partner: object = None


def test_objects_alive_after_the_warm_up_are_frozen_and_young_garbage_is_collected_first() -> None:
    built_on_first_use = [{"n": n} for n in range(1000)]
    cycle = _Node()
    cycle.partner = cycle  # garbage in a cycle: collected before the freeze, not frozen forever
    dead = weakref.ref(cycle)
    del cycle
    frozen_before = gc.get_freeze_count()
    try:
        asyncio.run(_freeze_after_warm_up(0))
        assert gc.get_freeze_count() >= frozen_before + len(built_on_first_use)
        assert len(gc.get_objects(2)) < len(built_on_first_use)
        assert dead() is None
    finally:
        gc.unfreeze()
