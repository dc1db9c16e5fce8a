"""The soak (behind DEX_HA_SOAK=1): random SIGKILLs of the active node and of Workers
while clients send messages and tools run, on a real three-node cluster (strict
durability) and real Worker processes. At the end it checks, from outside the server
(the tool ledger the Workers write, and the session snapshots):

- no acknowledged message is lost (every one is in its session's history);
- no single-attempt tool ran twice;
- no idempotent write ran with a key other than its call's;
- every call ends in a status its effect allows (read: succeeded or failed; a write:
  succeeded, outcome_unknown, or failed with the "did not run" prefix and no run in the
  ledger), and a call recorded succeeded ran to the end at least once;
- no turn is left unfinished.

It prints the totals. Knobs: DEX_HA_SOAK_KILLS (default 100), DEX_HA_SOAK_SEED (default:
random, printed, so a failing run replays its kill schedule), DEX_HA_SOAK_SESSIONS (4).

    DEX_HA_SOAK=1 python -m pytest tests/crash/test_soak.py -s
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dex_ha import TOOL_CALL_NOT_RUN_ERROR_PREFIX
from dex_ha.client import DexClient, DexError
from harness.cluster_process import LocalCluster
from harness.cluster_state import observe_settled
from tests.crash.columns import WorkerProcess
from tests.crash.ledger import Ledger

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("DEX_HA_SOAK") != "1", reason="the soak runs with DEX_HA_SOAK=1"),
]

KILLS = int(os.environ.get("DEX_HA_SOAK_KILLS", "100"))
SESSIONS = int(os.environ.get("DEX_HA_SOAK_SESSIONS", "4"))
WORKERS = 2
AGENT = "soak"
HEARTBEAT_TIMEOUT_MS = 2_000  # a killed Worker's attempt fails in ~2 s, not the default 30 s
PAUSE_BETWEEN_KILLS_S = (0.3, 2.5)
SETTLE_DEADLINE_S = 60.0  # a new active node, or all three nodes back after a restart
TURN_DEADLINE_S = 120.0  # one turn, through whatever kills land on it
FINAL_DEADLINE_S = 180.0  # every session idle after the last kill
MESSAGE_TRY_S = 5.0  # one try to send a message; a try that fails is repeated with the same id
ALLOWED = {  # effect -> the statuses a call may end in (the failure route of docs/crash-matrix.md)
    "read": {"succeeded", "failed"},
    "idempotent_write": {"succeeded", "failed", "outcome_unknown"},
    "write": {"succeeded", "failed", "outcome_unknown"},
}


@dataclass
class Totals:
    kills: Counter[str] = field(default_factory=Counter)
    acked: dict[str, list[str]] = field(default_factory=dict)  # session -> acknowledged message texts
    slow_turns: int = 0  # turns that outlived one TURN_DEADLINE_S wait (then waited for again)


@pytest.fixture
def soak_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    monkeypatch.setenv("DEX_HA_HEARTBEAT_TIMEOUT_MS", str(HEARTBEAT_TIMEOUT_MS))  # the nodes inherit it
    cluster = LocalCluster(tmp_path / "cluster", relaxed=False)
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()


def start_workers(cluster: LocalCluster, ledger: Path, logs: Path) -> list[WorkerProcess]:
    workers = [
        WorkerProcess(
            list(cluster.urls.values()),
            cluster.tokens["worker"],
            ledger=ledger,
            row="SOAK",
            agent=AGENT,
            column="soak",
            log_path=logs / f"worker-{i}.log",
        )
        for i in range(WORKERS)
    ]
    for worker in workers:
        worker.start()
    return workers


async def converse(client: DexClient, session_id: str, totals: Totals, stop: asyncio.Event) -> None:
    """Send a message, wait for its turn to end, repeat until told to stop. A message counts
    as acknowledged when the server answered 202; until then it is sent again with the same id."""
    await send_until_acked(client.create_session, AGENT, session_id=session_id)
    acked = totals.acked.setdefault(session_id, [])
    while not stop.is_set():
        text = f"m{len(acked)}"
        await send_until_acked(client.send_message, session_id, text, message_id=f"{session_id}-{text}")
        acked.append(text)
        await wait_idle(client, session_id, totals)


async def send_until_acked(send: Any, *args: Any, **kwargs: Any) -> Any:
    deadline = time.monotonic() + TURN_DEADLINE_S
    while True:
        try:
            return await asyncio.wait_for(send(*args, **kwargs), MESSAGE_TRY_S)
        except (TimeoutError, DexError):
            assert time.monotonic() < deadline, f"not acknowledged within {TURN_DEADLINE_S} s"


async def wait_idle(
    client: DexClient, session_id: str, totals: Totals, deadline_s: float = FINAL_DEADLINE_S
) -> dict[str, Any]:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return (await client.wait_until_idle(session_id, timeout_s=TURN_DEADLINE_S)).raw
        except (TimeoutError, DexError):
            totals.slow_turns += 1
            assert time.monotonic() < deadline, f"{session_id} not idle within {deadline_s} s"


async def kill_at_random(
    cluster: LocalCluster, workers: list[WorkerProcess], rng: random.Random, totals: Totals
) -> None:
    """KILLS SIGKILLs, each of the active node or of one Worker (then started again)."""
    admin = cluster.tokens["admin"]
    for n in range(KILLS):
        await asyncio.sleep(rng.uniform(*PAUSE_BETWEEN_KILLS_S))
        if rng.random() < 0.5:
            settled = await observe_settled(cluster.urls, admin, deadline_s=SETTLE_DEADLINE_S)
            assert settled.settled, f"kill {n}: the cluster did not settle: {settled.describe()}"
            dead = await cluster.active_node(deadline_s=SETTLE_DEADLINE_S)
            cluster.kill(dead)
            totals.kills["active node"] += 1
            await cluster.active_node(deadline_s=SETTLE_DEADLINE_S, not_=dead)  # a standby took the lease
            cluster.restart(dead)
        else:
            worker = rng.choice(workers)
            worker.kill()
            totals.kills["worker"] += 1
            worker.start()


def check(snapshots: dict[str, dict[str, Any]], ledger: Ledger, totals: Totals) -> tuple[list[str], Counter[str]]:
    """The violations, and the calls counted by (effect, status)."""
    violations: list[str] = []
    outcomes: Counter[str] = Counter()
    runs = ledger.runs("tool")
    started: dict[str, list[Any]] = {}
    finished: set[str] = set()
    for run in runs:
        assert run.call_id is not None, run  # the soak's tools record the call they run
        if run.moment == "started":
            started.setdefault(run.call_id, []).append(run)
        elif run.moment == "finished":
            finished.add(run.call_id)
    for session_id, snapshot in snapshots.items():
        said = [item["text"] for item in snapshot["history"] if item["type"] == "user"]
        violations += [
            f"{session_id}: acknowledged message {text!r} is not in the history"
            for text in totals.acked[session_id]
            if text not in said
        ]
        violations += [
            f"{session_id}: turn {t['number']} ended {t['status']}"
            for t in snapshot["turns"]
            if t["status"] not in ("completed", "failed")
        ]
        for call in snapshot["tool_calls"]:
            identity = f"{session_id}:{call['call_id']}"
            effect, status = call["effect"], call["status"]
            outcomes[f"{effect} {status}"] += 1
            ran = started.get(identity, [])
            violations += check_call(identity, effect, status, call.get("error") or "", ran, identity in finished)
    return violations, outcomes


def check_call(identity: str, effect: str, status: str, error: str, ran: list[Any], finished: bool) -> list[str]:
    problems = []
    if status not in ALLOWED[effect]:
        problems.append(f"{identity}: a {effect} ended {status}")
    if effect == "write" and len(ran) > 1:
        problems.append(f"{identity}: the single-attempt tool ran {len(ran)} times")
    if effect == "idempotent_write" and any(run.key != identity for run in ran):
        problems.append(f"{identity}: ran with keys {sorted({run.key for run in ran})}")
    if status == "failed" and effect != "read" and not error.startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX):
        problems.append(f"{identity}: a {effect} failed without the not-run prefix: {error!r}")
    if status == "failed" and error.startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX) and ran:
        problems.append(f"{identity}: recorded as not run, but the ledger has {len(ran)} run(s)")
    if status == "succeeded" and not finished:
        problems.append(f"{identity}: recorded succeeded, but no run finished")
    return problems


def print_totals(
    seed: int,
    totals: Totals,
    outcomes: Counter[str],
    ledger: Ledger,
    snapshots: dict[str, Any],
    violations: list[str],
    seconds: float,
) -> None:
    turns = Counter(t["status"] for s in snapshots.values() for t in s["turns"])
    tool_runs = Counter(run.name for run in ledger.runs("tool", moment="started"))
    print(f"\nsoak: seed {seed}, {seconds:.0f} s, {SESSIONS} sessions, {WORKERS} Worker processes")
    print(f"  kills: {sum(totals.kills.values())} ({', '.join(f'{n} {k}' for k, n in sorted(totals.kills.items()))})")
    print(
        f"  messages acknowledged: {sum(len(a) for a in totals.acked.values())}; "
        f"turns: {', '.join(f'{n} {k}' for k, n in sorted(turns.items()))}; "
        f"waits past {TURN_DEADLINE_S:.0f} s: {totals.slow_turns}"
    )
    for sid, snapshot in snapshots.items():
        for turn in snapshot["turns"]:
            if turn["status"] == "failed":
                print(f"    turn {turn['number']} of {sid} failed: {turn['error']}")
    print(f"  calls: {', '.join(f'{n} {k}' for k, n in sorted(outcomes.items()))}")
    print(f"  tool runs started: {', '.join(f'{n} {k}' for k, n in sorted(tool_runs.items()))}")
    print(f"  violations: {len(violations)}")
    for line in violations:
        print(f"    {line}")


@pytest.mark.timeout(3_600)
async def test_soak_random_kills_lose_nothing_and_repeat_no_single_attempt_tool(
    soak_cluster: LocalCluster, tmp_path: Path
) -> None:
    # Not `random` for the default: the test run seeds it, and every soak would repeat one schedule.
    seed = int(os.environ.get("DEX_HA_SOAK_SEED") or int.from_bytes(os.urandom(4), "big"))
    print(f"\nsoak seed {seed} (DEX_HA_SOAK_SEED={seed} replays the kill schedule)")
    rng = random.Random(seed)
    ledger_path = tmp_path / "ledger.sqlite"
    ledger = Ledger(ledger_path)  # creates the table before the Workers open it
    workers = start_workers(soak_cluster, ledger_path, tmp_path)
    totals, stop = Totals(), asyncio.Event()
    began = time.monotonic()
    session_ids = [f"soak-{seed}-{i}" for i in range(SESSIONS)]
    talkers: list[asyncio.Task[None]] = []
    killer: asyncio.Task[None] | None = None
    try:
        async with DexClient(list(soak_cluster.urls.values()), token=soak_cluster.tokens["client"]) as client:
            talkers = [asyncio.create_task(converse(client, sid, totals, stop)) for sid in session_ids]
            killer = asyncio.create_task(kill_at_random(soak_cluster, workers, rng, totals))
            done, _ = await asyncio.wait([killer, *talkers], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # a talker or the killer that failed: its error
            assert killer in done, "a client stopped before the kills were over"
            stop.set()
            await asyncio.wait_for(asyncio.gather(*talkers), FINAL_DEADLINE_S)
            snapshots = {sid: await wait_idle(client, sid, totals) for sid in session_ids}
    finally:
        stop.set()
        for task in [t for t in (killer, *talkers) if t is not None]:
            task.cancel()
        for worker in workers:
            worker.stop()
    violations, outcomes = check(snapshots, ledger, totals)
    print_totals(seed, totals, outcomes, ledger, snapshots, violations, time.monotonic() - began)
    assert sum(totals.kills.values()) == KILLS
    assert sum(len(a) for a in totals.acked.values()) > KILLS // 2, "too few messages went through to prove much"
    assert violations == []
