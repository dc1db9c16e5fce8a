"""What every node says about the cluster, read before and after a load: term, role,
leader, and the follower-side heartbeat gauge.

- `GET /v1/cluster` of each node: `term`, `role` (`active`, `standby`, ...), `leader_id`.
- `GET /metrics` of each node: `dex_raft_leader_contact_gap_max_seconds`, the largest gap
  between two consecutive messages the node received from the leader of the current term
  (reset when the term changes). Nodes that do not export it yet give None ("n/a").

A term that moved between two snapshots means an election happened in between (terms
never go back), so before/after is enough to count elections even when the same node won.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

CONTACT_GAP_GAUGE = "dex_raft_leader_contact_gap_max_seconds"
READ_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class NodeState:
    node_id: str
    url: str
    term: int | None = None
    role: str | None = None
    leader_id: str | None = None
    contact_gap_max_s: float | None = None  # None: the node does not export the gauge
    error: str | None = None  # why /v1/cluster could not be read

    def describe(self) -> str:
        if self.error is not None:
            return f"{self.node_id}: unreadable ({self.error})"
        gap = "n/a" if self.contact_gap_max_s is None else f"{self.contact_gap_max_s * 1000:.0f} ms"
        return f"{self.node_id}: {self.role}, term {self.term}, leader {self.leader_id}, leader contact gap {gap}"


@dataclass(frozen=True)
class ClusterSnapshot:
    nodes: tuple[NodeState, ...]

    @property
    def active(self) -> list[str]:
        return [n.node_id for n in self.nodes if n.role == "active"]

    @property
    def max_term(self) -> int | None:
        terms = [n.term for n in self.nodes if n.term is not None]
        return max(terms) if terms else None

    @property
    def settled(self) -> bool:
        """Every node answered, exactly one is active, and all agree on the term."""
        return (
            all(n.error is None for n in self.nodes)
            and len(self.active) == 1
            and len({n.term for n in self.nodes}) == 1
        )

    def largest_follower_gap_s(self) -> float | None:
        """The largest leader-contact gap seen by a node that is not active; None when no
        follower exports the gauge (or there is no follower: `dex-ha dev`)."""
        gaps = [n.contact_gap_max_s for n in self.nodes if n.role != "active" and n.contact_gap_max_s is not None]
        return max(gaps) if gaps else None

    def describe(self) -> str:
        return "; ".join(n.describe() for n in self.nodes)


def term_changes(before: ClusterSnapshot, after: ClusterSnapshot) -> int | None:
    """How many terms went by between the two snapshots (None if a term is unknown)."""
    if before.max_term is None or after.max_term is None:
        return None
    return after.max_term - before.max_term


def parse_gauge(metrics_text: str, name: str) -> float | None:
    """The value of an unlabelled gauge in Prometheus text, or None if it is absent."""
    for line in metrics_text.splitlines():
        if line.startswith(name) and (line[len(name) : len(name) + 1] in (" ", "{")):
            try:
                return float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                return None
    return None


async def read_node(http: aiohttp.ClientSession, node_id: str, url: str, token: str | None) -> NodeState:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = aiohttp.ClientTimeout(total=READ_TIMEOUT_S)
    try:
        async with http.get(url + "/v1/cluster", headers=headers, timeout=timeout) as resp:
            if resp.status != 200:
                return NodeState(node_id, url, error=f"HTTP {resp.status}: {(await resp.text())[:200]}")
            view = await resp.json()
        async with http.get(url + "/metrics", timeout=timeout) as resp:
            gap = parse_gauge(await resp.text(), CONTACT_GAP_GAUGE) if resp.status == 200 else None
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        return NodeState(node_id, url, error=f"{type(exc).__name__}: {exc}")
    return NodeState(
        node_id,
        url,
        term=view.get("term"),
        role=view.get("role"),
        leader_id=view.get("leader_id"),
        contact_gap_max_s=gap,
    )


async def observe(urls: Mapping[str, str], token: str | None) -> ClusterSnapshot:
    """One read of every node (node id -> base URL), all at once."""
    async with aiohttp.ClientSession() as http:
        states = await asyncio.gather(*(read_node(http, node_id, url, token) for node_id, url in urls.items()))
    return ClusterSnapshot(tuple(states))


class FollowerGapSampler:
    """Reads the contact-gap gauge of the nodes that do not take the load, every
    `interval_s`, inside `async with FollowerGapSampler(urls) as sampler:`. The gauge
    restarts at each new term, so the largest value seen over the samples is the largest
    gap of the whole run, including the gap that ended in an election (which a read after
    the load no longer shows)."""

    def __init__(self, urls: Mapping[str, str], interval_s: float = 0.25) -> None:
        self.urls = dict(urls)
        self.interval_s = interval_s
        self.max_gap_s: float | None = None  # None: no sample had the gauge
        self.samples = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> FollowerGapSampler:
        self._task = asyncio.create_task(self.run())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def run(self) -> None:
        """Sample until cancelled."""
        timeout = aiohttp.ClientTimeout(total=READ_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                await asyncio.gather(*(self._sample(http, url) for url in self.urls.values()))
                await asyncio.sleep(self.interval_s)

    async def _sample(self, http: aiohttp.ClientSession, url: str) -> None:
        try:
            async with http.get(url + "/metrics") as resp:
                gap = parse_gauge(await resp.text(), CONTACT_GAP_GAUGE) if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError):
            return  # a missed sample; the next one comes
        self.samples += 1
        if gap is not None and (self.max_gap_s is None or gap > self.max_gap_s):
            self.max_gap_s = gap


async def observe_settled(urls: Mapping[str, str], token: str | None, deadline_s: float = 20.0) -> ClusterSnapshot:
    """Read every node until the cluster is settled (one active node, one term) or the
    deadline passes; the last snapshot either way (the caller judges it)."""
    deadline = time.monotonic() + deadline_s
    while True:
        snapshot = await observe(urls, token)
        if snapshot.settled or time.monotonic() > deadline:
            return snapshot
        await asyncio.sleep(0.1)
