"""Crash cells of the Worker channel, on real processes (the matrix's cells run on the
channel too: it is the SDK's default).

- The channel drops before the frame with the tool's result is sent: the attempt fails
  once the channel's grace is over and follows its row (a read runs again with its key).
- The channel drops after that frame committed: that is R19-worker_kill (the Worker exits
  at `worker.complete.after-send`, i.e. once the ack came): the result stands.
- A takeover: the Worker's channel closes with "not active", the Worker reconnects to the
  new active node over the channel (no HTTP polls there) and the next turn runs.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp

from harness.waiting import eventually
from tests.crash.cell import COMPLETED, FAILED, Cell, attempts, call_of
from tests.crash.columns import Column
from tests.crash.scenarios import assert_ran_again_with_the_key

ROW = "R19"  # the model calls `lookup` (a read) once, then answers "done"


async def node_metrics(url: str) -> tuple[dict[str, float], float]:
    """One node's `dex_http_requests_total` summed by route (a request is counted once
    answered, so an open channel is not), and its `dex_worker_channels_open`."""
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
        text = await resp.text()
    counts: dict[str, float] = {}
    channels = 0.0
    for line in text.splitlines():
        if line.startswith("dex_http_requests_total{"):
            labels, value = line.rsplit(" ", 1)
            route = labels.split('route="', 1)[1].split('"', 1)[0]
            counts[route] = counts.get(route, 0) + float(value)
        elif line.startswith("dex_worker_channels_open "):
            channels = float(line.split()[1])
    return counts, channels


async def test_a_channel_dropped_before_its_result_frame_is_sent(columns: dict[str, Column], tmp_path: Path) -> None:
    column = columns["worker_kill"]
    await column.ready()
    cell = Cell(ROW, column, tmp_path)
    try:
        await cell.open()
        worker = cell.start_worker(failpoints="worker.channel.before-results@2")  # the 2nd frame: the tool's result
        await cell.send("go")
        await cell.fail()  # the worker process exits at the failpoint
        assert cell.deaths == ["exit 99 at a Worker failpoint"]
        worker.failpoints = ""
        await cell.recover()
        snap = await cell.idle()
        call = call_of(snap, "c1")
        assert (call["status"], call["output"]) == ("succeeded", "done")
        assert attempts(call["steps"], "CallTool") == [FAILED, COMPLETED]
        assert_ran_again_with_the_key(cell, "lookup", "c1", finished=[1, 2])  # attempt 1's result never left
    finally:
        await cell.close()


async def test_a_worker_reconnects_its_channel_to_the_new_active_node(
    columns: dict[str, Column], tmp_path: Path
) -> None:
    column = columns["takeover"]
    await column.ready()
    cell = Cell(ROW, column, tmp_path)
    try:
        await cell.open()
        cell.start_worker()
        await cell.send("go")
        await cell.idle()
        await cell.fail()  # SIGKILL of the active node
        await cell.recover()
        # A second session (the row's model calls `c1` in its first turn, and a call id is
        # used once per session): its steps can only reach the Worker over the new channel.
        other = await cell.open_another()
        await cell.client.send_message(other, "again")
        snap = await cell.idle(other)
        assert [t["status"] for t in snap["turns"]] == ["completed"], snap["turns"]
        active = await column.cluster.active_node()  # type: ignore[attr-defined]
        url = column.cluster.urls[active]  # type: ignore[attr-defined]

        async def one_channel_open() -> bool:  # /metrics is rendered at most once a second
            return (await node_metrics(url))[1] == 1

        await eventually(one_channel_open, "the Worker's channel open on the new active node", 10)
        counts, _ = await node_metrics(url)
        assert counts.get("worker_poll", 0) == 0, counts  # the Worker stayed on the channel
    finally:
        await cell.close()
