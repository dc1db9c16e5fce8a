"""RaftTransport.snapshots_in_flight: the bytes of a snapshot written so far, for `dex-ha members`."""

from __future__ import annotations

import asyncio
import os
import time

from dex_ha.raft.types import Message, MessageType
from harness.waiting import eventually
from tests.raft.test_transport import SNAP_META, started
from tests.raft.transport_helpers import DEADLINE, SECRET, make_node

DEADLINE_S = 20.0


async def test_a_snapshot_being_sent_reports_its_bytes_until_it_is_done() -> None:
    a, b = await started(
        make_node("a", secret=SECRET, max_frame_bytes=2 << 20), make_node("b", secret=SECRET, max_frame_bytes=2 << 20)
    )
    try:
        total = 16 << 20
        assert a.transport.snapshots_in_flight() == {}
        a.transport.send(Message(MessageType.SNAP, "b", "a", term=7, snapshot=SNAP_META, data=os.urandom(total)))
        seen: list[tuple[int, int]] = []
        deadline = time.monotonic() + DEADLINE_S
        while not a.snapshots_sent and time.monotonic() < deadline:  # sample on every turn of the loop
            progress = a.transport.snapshots_in_flight()
            if progress:
                assert set(progress) == {"b"}
                seen.append(progress["b"])
            await asyncio.sleep(0)
        await eventually(lambda: a.snapshots_sent == [("b", True)], deadline_s=DEADLINE)
        assert seen, "the snapshot was never seen in flight"
        assert {t for _, t in seen} == {total}
        sent = [s for s, _ in seen]
        assert sent == sorted(sent) and all(0 <= s <= total for s in sent)
        assert any(s < total for s in sent)  # seen part-way, not only at the end
        assert len((await b.recv()).data) == total
        assert a.transport.snapshots_in_flight() == {}  # done: nothing to show any more
    finally:
        await a.transport.stop()
        await b.transport.stop()
