"""The hand-off between the HTTP loop and the Raft thread (dex_ha.raft.threaded)."""

from __future__ import annotations

import asyncio
import threading

from dex_ha.raft.threaded import _Handoff


def test_items_put_before_the_target_loop_runs_are_delivered_in_one_batch() -> None:
    """Proposals put while the Raft loop is busy cross together: one wake-up, one batch."""
    loop = asyncio.new_event_loop()
    try:
        batches: list[list[int]] = []
        handoff: _Handoff[int] = _Handoff(loop, batches.append)

        def put_all() -> None:
            for i in range(100):
                handoff.put(i)

        putter = threading.Thread(target=put_all)
        putter.start()
        putter.join(timeout=10)
        assert not putter.is_alive()
        loop.run_until_complete(asyncio.sleep(0))  # one pass of the loop runs what was scheduled
        assert batches == [list(range(100))]
        handoff.put(100)  # a later item starts the next batch
        loop.run_until_complete(asyncio.sleep(0))
        assert batches == [list(range(100)), [100]]
    finally:
        loop.close()
