"""The clients of a robustness run: sessions driven through the Client SDK, as users drive
them, and the record of what the cluster acknowledged.

Each session has a random.Random of its own (drawn from the run's seed), so the sequence
of what it asks for does not depend on how the other sessions are timed. A session:

- is created (acknowledged: the SDK returned the 200 or 201 answer);
- sends messages `"<message id> <step> ..."` (acknowledged: the 202), each asking the agent
  (tests/crash/agents.py, `robustness`) for zero to three steps: a read tool, an idempotent
  write, a single-attempt write, a single-attempt write that waits for approval, a timer;
- reads its snapshot while the turn runs, decides what waits for approval (acknowledged:
  the 200): approves it, or, for about one call in four, denies it (drawn from the session's
  Random when the message is sent, so the seed decides which calls are denied), and either
  waits until the session is idle or queues the next message at once.

Every try has a deadline and is repeated with the same ids until it is acknowledged, as
the SDK documents (a repeat is a no-op). Reads are recorded with what the session had been
told before the read was sent, so the checker can find a read that missed an
acknowledged write (a stale read).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dex_ha.client import DexClient, DexError
from tests.crash.agents import ROBUSTNESS_STEPS, robustness_call

AGENT = "robustness"
STEPS = (*ROBUSTNESS_STEPS, "sleep")
MAX_STEPS_PER_MESSAGE = 3
QUEUE_NEXT_P = 0.2  # how often the next message is sent while the turn still runs
DENY_P = 0.25  # how often a call that waits for approval is denied
DENY_REASON = "denied by the robustness workload"
TRY_S = 3.0  # one try of a request; a try that fails is repeated with the same ids
ACK_DEADLINE_S = 120.0  # a write not acknowledged by then fails the run (the cluster is stuck)
POLL_S = 0.2  # how often a session re-reads its snapshot while its turn runs

T = TypeVar("T")


@dataclass(frozen=True)
class Read:
    """One snapshot read: what the session had been told before it was sent, and what it saw."""

    session_id: str
    acked_messages: frozenset[str]
    acked_approvals: frozenset[str]  # approved or denied
    found: bool  # False: the read answered 404
    seen_messages: frozenset[str] = frozenset()
    pending_approvals: frozenset[str] = frozenset()


@dataclass
class Acknowledged:
    """What the cluster acknowledged to the clients, and the reads they made."""

    sessions: list[str] = field(default_factory=list)
    messages: dict[str, list[str]] = field(default_factory=dict)  # session -> message ids
    approvals: dict[str, list[str]] = field(default_factory=dict)  # session -> call ids approved
    denials: dict[str, list[str]] = field(default_factory=dict)  # session -> call ids denied
    reads: list[Read] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)  # 4xx answers that are not errors (kind)
    retries: int = 0  # tries that failed and were repeated

    def decided(self, session_id: str) -> list[str]:
        """The calls of a session whose approval or denial was acknowledged."""
        return self.approvals[session_id] + self.denials[session_id]


def messages_in(snapshot: dict[str, Any]) -> set[str]:
    """The message ids a session snapshot holds: those that started a turn, and those waiting."""
    return {t["message_id"] for t in snapshot["turns"]} | {m["message_id"] for m in snapshot["waiting_messages"]}


def pending_approvals_in(snapshot: dict[str, Any]) -> set[str]:
    return {a["call_id"] for a in snapshot["pending_approvals"]}


class SessionClient:
    """One session's client loop (run until `stop`, then `drain`)."""

    def __init__(
        self, client: DexClient, session_id: str, rng: random.Random, acked: Acknowledged, stop: asyncio.Event
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.rng = rng
        self.acked = acked
        self.stop = stop
        self.sent = 0
        self.to_deny: set[str] = set()  # call ids this session denies when they wait for approval

    async def run(self) -> None:
        await self._until_acknowledged(lambda: self.client.create_session(AGENT, session_id=self.session_id))
        self.acked.sessions.append(self.session_id)
        self.acked.messages[self.session_id] = []
        self.acked.approvals[self.session_id] = []
        self.acked.denials[self.session_id] = []
        while not self.stop.is_set():
            await self.send_next()
            if self.rng.random() >= QUEUE_NEXT_P:
                await self.until_idle(lambda: self.stop.is_set())

    async def send_next(self) -> None:
        steps = self.rng.sample(STEPS, self.rng.randint(0, MAX_STEPS_PER_MESSAGE))
        message_id = f"{self.session_id}-m{self.sent}"
        self.sent += 1
        if "approve" in steps and self.rng.random() < DENY_P:
            self.to_deny.add(robustness_call(message_id, "approve")[0])
        text = " ".join([message_id, *steps])
        await self._until_acknowledged(lambda: self.client.send_message(self.session_id, text, message_id=message_id))
        self.acked.messages[self.session_id].append(message_id)

    async def drain(self, deadline_s: float) -> None:
        """After the faults: decide what waits for approval, until the session is idle or the
        deadline passes (the checker then finds it unsettled in the final snapshot)."""
        if self.session_id in self.acked.messages:
            deadline = time.monotonic() + deadline_s
            await self.until_idle(lambda: time.monotonic() > deadline)

    async def until_idle(self, give_up: Callable[[], bool]) -> None:
        """Read the snapshot, decide what waits for approval, until the session is idle."""
        while not give_up():
            snapshot = await self.read()
            if snapshot is not None:
                for call_id in sorted(pending_approvals_in(snapshot) - set(self.acked.decided(self.session_id))):
                    await self.decide(call_id)
                if snapshot["status"] == "idle" and not snapshot["waiting_messages"]:
                    return
            await asyncio.sleep(POLL_S)

    async def read(self) -> dict[str, Any] | None:
        """One read of the snapshot, recorded; None when the try failed (no answer in time)."""
        acked_messages = frozenset(self.acked.messages[self.session_id])
        acked_approvals = frozenset(self.acked.decided(self.session_id))
        try:
            async with asyncio.timeout(TRY_S):
                snapshot = (await self.client.get_session(self.session_id)).raw
        except DexError as exc:
            if exc.status != 404:
                return None
            self.acked.reads.append(Read(self.session_id, acked_messages, acked_approvals, found=False))
            return None
        except TimeoutError:
            return None
        self.acked.reads.append(
            Read(
                self.session_id,
                acked_messages,
                acked_approvals,
                found=True,
                seen_messages=frozenset(messages_in(snapshot)),
                pending_approvals=frozenset(pending_approvals_in(snapshot)),
            )
        )
        return snapshot

    async def decide(self, call_id: str) -> None:
        """Approve the call, or deny it when the seed said so; recorded once acknowledged."""
        approved = call_id not in self.to_deny
        reason = None if approved else DENY_REASON
        try:
            await self._until_acknowledged(
                lambda: self.client.approve(self.session_id, call_id, approved=approved, reason=reason)
            )
        except DexError as exc:  # 409: no longer waiting (say, its turn failed meanwhile)
            self.acked.refused[f"{'approval' if approved else 'denial'} {exc.status} {exc.code}"] += 1
            return
        (self.acked.approvals if approved else self.acked.denials)[self.session_id].append(call_id)

    async def _until_acknowledged(self, send: Callable[[], Awaitable[T]]) -> T:
        """`send()` until it is answered 2xx; a 4xx (a DexError that is not 503) is raised."""
        deadline = time.monotonic() + ACK_DEADLINE_S
        while True:
            try:
                async with asyncio.timeout(TRY_S):
                    return await send()
            except TimeoutError:
                pass
            except DexError as exc:
                if exc.status < 500:
                    raise
            self.acked.retries += 1
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.session_id}: not acknowledged within {ACK_DEADLINE_S} s")


async def final_snapshots(client: DexClient, session_ids: list[str], deadline_s: float) -> dict[str, Any]:
    """Each session's snapshot read through the API after healing (None: 404)."""
    snapshots: dict[str, Any] = {}
    for session_id in session_ids:
        deadline = time.monotonic() + deadline_s
        while session_id not in snapshots:
            try:
                async with asyncio.timeout(TRY_S):
                    snapshots[session_id] = (await client.get_session(session_id)).raw
            except DexError as exc:
                if exc.status == 404:
                    snapshots[session_id] = None
            except TimeoutError:
                pass
            if session_id not in snapshots and time.monotonic() > deadline:
                raise AssertionError(f"{session_id}: no snapshot read within {deadline_s} s after healing")
    return snapshots


def client_for(urls: list[str], token: str) -> DexClient:
    """The SDK as a user configures it: every node's URL; one try gives up after TRY_S."""
    return DexClient(urls, token=token, request_timeout_s=TRY_S, give_up_after_s=TRY_S)


def session_rngs(rng: random.Random, count: int) -> list[random.Random]:
    return [random.Random(rng.getrandbits(64)) for _ in range(count)]
