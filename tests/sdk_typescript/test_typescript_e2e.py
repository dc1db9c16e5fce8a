"""The TypeScript SDK against a real `dex-ha dev` process: a TypeScript Worker (a `node`
process) runs an agent with a ScriptedModel and one tool; the Python DexClient drives a turn
through it (a session may name the agent before the Worker registers it: the turn waits
for the Worker), and the TypeScript DexClient creates a session and follows its events.

Evidence from outside the Worker: the snapshot's history and tool calls, and the events the
TypeScript client printed."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dex_ha.client import DexClient
from harness.dev_process import DevProcess
from harness.typescript_sdk import BUILD_DIR, node_missing, running_node_program

pytestmark = pytest.mark.skipif(node_missing() is not None, reason=str(node_missing()))

AGENT = "ts-lookup"
DEADLINE_S = 30.0


@pytest.fixture
def ts_worker(dev: DevProcess, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    args = ["--url", dev.url, "--agent", AGENT]
    with running_node_program("lookup_worker", args, tmp_path / "worker.log") as proc:
        yield proc


async def test_python_client_drives_a_turn_through_the_typescript_worker(
    dev: DevProcess, ts_worker: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    async with DexClient([dev.url], backoff_max_s=0.2) as client:
        session = await client.create_session(AGENT)
        await client.send_message(session.session_id, "order-7")
        snapshot = await client.wait_until_idle(session.session_id, timeout_s=DEADLINE_S)
    log = (tmp_path / "worker.log").read_text(errors="replace")
    assert ts_worker.poll() is None, log
    assert [turn.status for turn in snapshot.turns] == ["completed"], snapshot
    results = [
        {k: v for k, v in item.items() if k != "seq"} for item in snapshot.history if item["type"] == "tool_result"
    ]
    expected = {"order": "order-7", "status": "shipped", "key": f"{session.session_id}:c0_0"}
    assert results == [
        {"type": "tool_result", "call_id": "c0_0", "name": "lookup", "status": "succeeded", "output": expected}
    ]
    assert snapshot.history[-1]["type"] == "assistant"
    assert (
        snapshot.history[-1]["content"] == f"lookup said {json.dumps(expected, sort_keys=True, separators=(',', ':'))}"
    )


async def test_typescript_client_creates_a_session_and_follows_its_events(
    dev: DevProcess, ts_worker: subprocess.Popen[bytes]
) -> None:
    done = subprocess.run(
        [
            "node",
            str(BUILD_DIR / "test" / "e2e" / "follow_client.js"),
            "--url",
            dev.url,
            "--agent",
            AGENT,
            "--text",
            "unknown",
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S + 15,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["created"]["agent"] == AGENT and seen["created"]["metadata"] == {"from": "typescript"}
    assert seen["accepted"]["session_id"] == seen["created"]["session_id"]
    assert seen["types"][-1] == "turn_completed", seen["types"]
    assert "turn_started" in seen["types"], seen["types"]
    assert seen["text"] == 'lookup said "no such order"', seen
    snapshot = seen["snapshot"]
    assert snapshot["status"] == "idle"
    assert [(c["name"], c["status"], c["error"]) for c in snapshot["tool_calls"]] == [
        ("lookup", "failed", "no such order")
    ]
