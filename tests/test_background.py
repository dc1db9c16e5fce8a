"""dex_ha.background: the timer loop of the active node's services, and stopping a task."""

from __future__ import annotations

import asyncio

import pytest

from dex_ha.background import ActiveNodeTimer, cancel_and_wait
from harness.waiting import eventually


async def test_the_timer_ticks_only_while_the_node_serves_and_stop_ends_its_task() -> None:
    serving = False
    asked = 0
    ticks = 0

    def is_serving() -> bool:
        nonlocal asked
        asked += 1
        return serving

    async def tick() -> None:
        nonlocal ticks
        ticks += 1

    timer = ActiveNodeTimer("test-timer", 0.001, tick)
    timer.start(is_serving)
    await eventually(lambda: asked >= 3, "three intervals on a node that does not serve")
    assert ticks == 0
    serving = True
    await eventually(lambda: ticks >= 2, "two ticks once the node serves")
    await timer.stop()
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "test-timer"]


async def test_cancel_and_wait_ends_a_running_task_and_raises_what_a_failed_one_raised() -> None:
    await cancel_and_wait(None)  # nothing to stop

    running = asyncio.create_task(asyncio.Event().wait())
    await cancel_and_wait(running)
    assert running.cancelled()

    async def fail() -> None:
        raise RuntimeError("it failed before the stop")

    failed = asyncio.create_task(fail())
    await asyncio.wait({failed})
    with pytest.raises(RuntimeError, match="before the stop"):
        await cancel_and_wait(failed)
