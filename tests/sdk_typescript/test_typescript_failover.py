"""The TypeScript SDK through a SIGKILL of the active node, on a three-node cluster started
with `dex-ha cluster up` (real processes): the TypeScript Worker and the TypeScript
DexClient run in their own `node` processes, given all three node URLs.

- The Worker: a turn's tool runs (attempt 1) when the active node dies. A standby takes
  over and fails that attempt; the same Worker process, never restarted, reconnects to the
  new active node by itself, stops the attempt the new node no longer holds, runs attempt
  2 (a higher term, the same idempotency key) and the turn completes.
- The Client: it follows the session's events while the active node dies; it resumes on
  the new active node and prints the turn's later events, each committed event once: the
  ids it printed are the session's events read afterwards by the Python client.

Evidence from outside the Worker: the ledger its tool writes (with its pid), the snapshot,
and the event ids the TypeScript client printed."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dex_ha.client import DexClient, SessionEvent
from harness.cluster_process import LocalCluster, cluster_up
from harness.processes import stop
from harness.typescript_sdk import node_missing, running_node_program, start_node_program
from harness.waiting import eventually
from tests.crash.ledger import JsonLedger
from tests.support.failover_agent import attempts_of

pytestmark = pytest.mark.skipif(node_missing() is not None, reason=str(node_missing()))

AGENT = "ts-ha"
CALL_ID = "c-failover"
DEADLINE_S = 45.0
# After the takeover, the Worker's reconnect to the new node stops the attempt it no longer holds.
STALE_ATTEMPT_STOPPED_S = 10.0


@pytest.fixture
def cluster(tmp_path: Path, built: None) -> Iterator[LocalCluster]:
    with cluster_up(tmp_path / "cluster") as local:
        yield local


def node_urls(cluster: LocalCluster) -> str:
    return ",".join(cluster.urls.values())


@pytest.fixture
def ledger(tmp_path: Path) -> JsonLedger:
    return JsonLedger(tmp_path / "ledger.jsonl")


@pytest.fixture
def ts_worker(cluster: LocalCluster, ledger: JsonLedger, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    args = ["--urls", node_urls(cluster), "--token", cluster.tokens["worker"], "--agent", AGENT]
    with running_node_program(
        "failover_worker", [*args, "--ledger", str(ledger.path)], tmp_path / "worker.log"
    ) as proc:
        yield proc


@pytest.fixture
async def client(cluster: LocalCluster) -> AsyncIterator[DexClient]:
    async with DexClient(list(cluster.urls.values()), token=cluster.tokens["client"], backoff_max_s=0.2) as dex:
        yield dex


@dataclass(frozen=True)
class Rig:
    """A cluster with the TypeScript Worker running, the ledger its tool writes, a Python
    client and a new session of the agent (`sid`)."""

    cluster: LocalCluster
    ts_worker: subprocess.Popen[bytes]
    ledger: JsonLedger
    client: DexClient
    sid: str

    async def turn_through_a_kill(self) -> str:
        """Send the session the turn, SIGKILL the active node while the tool's first attempt
        runs and wait for a standby to take over. Returns the killed node's id."""
        await self.client.send_message(self.sid, "failover")
        await eventually(
            lambda: self.ledger.count("tool", "slow_put") >= 1, "the tool's first attempt to run", DEADLINE_S
        )
        old = await self.cluster.active_node(deadline_s=DEADLINE_S)
        self.cluster.kill(old)
        new = await self.cluster.active_node(deadline_s=DEADLINE_S, not_=old)
        assert new != old
        return old


@pytest.fixture
async def rig(cluster: LocalCluster, ts_worker: subprocess.Popen[bytes], ledger: JsonLedger, client: DexClient) -> Rig:
    return Rig(cluster, ts_worker, ledger, client, (await client.create_session(AGENT)).session_id)


async def test_the_same_typescript_worker_process_finishes_the_turn_on_the_new_active_node(
    rig: Rig, tmp_path: Path
) -> None:
    await rig.turn_through_a_kill()

    final = await rig.client.wait_until_idle(rig.sid, timeout_s=DEADLINE_S)
    log = (tmp_path / "worker.log").read_text(errors="replace")
    assert rig.ts_worker.poll() is None, f"the Worker process exited:\n{log}"
    assert final.turns[-1].status == "completed", log
    call = final.tool_call(CALL_ID)
    assert call.status == "succeeded" and call.output == "stored failover"
    attempts = attempts_of(final.raw, CALL_ID)
    assert [a["status"] for a in attempts] == ["failed", "completed"]
    assert "lost its lease" in attempts[0]["error"]  # failed by the new node's takeover
    assert attempts[1]["term"] > attempts[0]["term"]  # the completed attempt ran on the new active node
    assert attempts[0]["worker_id"] == attempts[1]["worker_id"] and f"-{rig.ts_worker.pid}-" in attempts[1]["worker_id"]
    # The ledger (outside the server): one process ran both attempts, with the call's key.
    runs = rig.ledger.runs("tool", "slow_put", "started")
    assert [(r.key, r.attempt, r.pid) for r in runs] == [(f"{rig.sid}:{CALL_ID}", n, rig.ts_worker.pid) for n in (1, 2)]
    # The Worker stopped the attempt the new active node had failed (it no longer holds it).
    await eventually(
        lambda: [r.attempt for r in rig.ledger.runs("tool", "slow_put", "cancelled")] == [1],
        "the Worker to stop the attempt the new active node had failed",
        STALE_ATTEMPT_STOPPED_S,
    )


def printed_events(proc: subprocess.Popen[bytes]) -> list[dict]:
    assert proc.stdout is not None
    return [json.loads(line) for line in proc.stdout.read().decode().splitlines() if line.strip()]


async def read_committed(client: DexClient, sid: str) -> list[SessionEvent]:
    """The session's whole committed history of events, read anew, to its turn_completed."""
    events = []
    async for event in client.events(sid):
        if event.id is None:
            continue
        events.append(event)
        if event.type == "turn_completed":
            return events
    return events


async def test_the_typescript_client_resumes_its_event_stream_after_a_sigkill_of_the_active_node(
    rig: Rig, tmp_path: Path
) -> None:
    args = ["--urls", node_urls(rig.cluster), "--token", rig.cluster.tokens["client"], "--session", rig.sid]
    follower = start_node_program("failover_follow", args, tmp_path / "follow.log", stdout=subprocess.PIPE)
    try:
        await rig.turn_through_a_kill()
        await rig.client.wait_until_idle(rig.sid, timeout_s=DEADLINE_S)
        await eventually(lambda: follower.poll() is not None, "the TypeScript client to see turn_completed", DEADLINE_S)
        log = (tmp_path / "follow.log").read_text(errors="replace")
        assert follower.returncode == 0, log
        assert "dropped" in log and "reconnecting" in log, log  # it was following when the node died
        printed = printed_events(follower)
    finally:
        stop(follower, timeout=10)
    fresh = await read_committed(rig.client, rig.sid)
    committed = [e for e in printed if e["id"] is not None]
    assert [e["id"] for e in committed] == [e.id for e in fresh], log  # nothing twice, nothing missed
    # It saw the turn's events after the takeover: the failed attempt, the retry, the end.
    types = [e["type"] for e in committed]
    assert {"attempt_failed", "turn_completed"} <= set(types), types
    assert any(e["type"] == "attempt_started" and e["attempt"] == 2 for e in committed), committed
