"""A record of every node's `/readyz`, asked every 10 ms from outside the cluster.

Each round asks every node at once (on its probe port, as a balancer does) and records one
row per node: (round, time of the answer, node, status). A node that does not answer in
time, or refuses the connection (killed), is recorded with status None. Tests assert on the
record afterwards: never two nodes answering 200 in one round, which node stopped being
ready before which other one became ready, how long nobody was ready.

    async with ReadinessRecorder(probe_urls) as record:
        ... faults ...
    assert record.overlapping_rounds() == []
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import aiohttp

INTERVAL_S = 0.01
ANSWER_TIMEOUT_S = 0.5
MAX_DURATION_S = 600.0  # the recorder stops itself then, even if its owner never does


@dataclass(frozen=True)
class ProbeRow:
    round: int
    at: float  # time.monotonic() when the answer (or the failure) arrived
    node: str
    status: int | None  # None: no answer (refused, reset, timed out)


class ReadinessRecorder:
    """Records the readiness of the nodes of `probe_urls` (node id -> base URL) in the
    body of `async with`; a task of its own, stopped at the end of the block or after
    `max_duration_s`."""

    def __init__(
        self, probe_urls: Mapping[str, str], interval_s: float = INTERVAL_S, max_duration_s: float = MAX_DURATION_S
    ) -> None:
        self.urls = dict(probe_urls)
        self.interval_s = interval_s
        self.max_duration_s = max_duration_s
        self.rows: list[ProbeRow] = []
        self.rounds = 0
        self._task: asyncio.Task[None] | None = None
        self._round_done = asyncio.Event()

    async def __aenter__(self) -> ReadinessRecorder:
        self._task = asyncio.create_task(self._run(), name="readiness-recorder")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    def add_node(self, node: str, url: str) -> None:
        """Ask `node` too from the next round on (a node that joined)."""
        self.urls[node] = url

    async def _run(self) -> None:
        deadline = time.monotonic() + self.max_duration_s
        timeout = aiohttp.ClientTimeout(total=ANSWER_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http:
            while time.monotonic() < deadline:
                started = time.monotonic()
                self.rounds += 1
                answers = await asyncio.gather(*(self._ask(http, url) for url in self.urls.values()))
                for node, (at, status) in zip(list(self.urls), answers):
                    self.rows.append(ProbeRow(self.rounds, at, node, status))
                self._round_done.set()
                await asyncio.sleep(max(0.0, started + self.interval_s - time.monotonic()))

    @staticmethod
    async def _ask(http: aiohttp.ClientSession, url: str) -> tuple[float, int | None]:
        try:
            async with http.get(url + "/readyz") as resp:
                await resp.read()
                return time.monotonic(), resp.status
        except (aiohttp.ClientError, OSError, TimeoutError):
            return time.monotonic(), None

    async def next_round(self) -> None:
        """Wait until one more round is recorded (so that a state is in the record)."""
        target = self.rounds + 1
        while self.rounds < target:
            self._round_done.clear()
            await self._round_done.wait()

    async def wait_ready(self, since: float, nodes: set[str] | None, deadline_s: float) -> ProbeRow:
        """The first 200 after `since` of one of `nodes`, once the record has it."""
        deadline = time.monotonic() + deadline_s
        while (row := self.first_ready(since, nodes)) is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"none of {sorted(nodes or self.urls)} answered /readyz 200 within {deadline_s} s")
            await self.next_round()
        return row

    # ---------------------------------------------------------------- reading the record

    def ready_by_round(self, since: float = 0.0) -> dict[int, list[str]]:
        """Round -> the nodes that answered 200 in it (rounds answered after `since`)."""
        return ready_by_round(self.rows, since)

    def overlapping_rounds(self) -> list[tuple[int, list[str]]]:
        """The rounds in which two or more nodes answered 200."""
        return overlapping_rounds(self.rows)

    def first_ready(self, since: float, nodes: set[str] | None = None) -> ProbeRow | None:
        """The first 200 after `since`, of one of `nodes` (any node when None)."""
        return next(
            (
                row
                for row in self.rows
                if row.at >= since and row.status == 200 and (nodes is None or row.node in nodes)
            ),
            None,
        )

    def last_ready(self, node: str, before_round: int | None = None) -> ProbeRow | None:
        """`node`'s last 200 in the record (before round `before_round`, if given)."""
        rows = [
            row
            for row in self.rows
            if row.node == node and row.status == 200 and (before_round is None or row.round < before_round)
        ]
        return rows[-1] if rows else None

    def describe_around(self, at: float, window_s: float = 0.3) -> str:
        """The rows within `window_s` of `at`, one line per round: for a failure message."""
        lines: dict[int, list[str]] = {}
        for row in self.rows:
            if abs(row.at - at) <= window_s:
                lines.setdefault(row.round, []).append(f"{row.node}={row.status}")
        return "\n".join(f"round {r}: {' '.join(cells)}" for r, cells in lines.items())


def ready_by_round(rows: Iterable[ProbeRow], since: float = 0.0) -> dict[int, list[str]]:
    """Round -> the nodes that answered 200 in it (rows answered after `since`); a record's
    rows, or rows a checker is given."""
    ready: dict[int, list[str]] = {}
    for row in rows:
        if row.at >= since:
            ready.setdefault(row.round, [])
            if row.status == 200:
                ready[row.round].append(row.node)
    return ready


def overlapping_rounds(rows: Iterable[ProbeRow]) -> list[tuple[int, list[str]]]:
    """The rounds in which two or more nodes answered 200."""
    return [(r, nodes) for r, nodes in ready_by_round(rows).items() if len(nodes) > 1]
