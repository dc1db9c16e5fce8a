"""`dex-ha sessions watch` and `dex-ha status --watch` as a user runs them, against real
processes: a `dex-ha dev` node with a Worker of this process for the session's turn, and a
three-node `dex-ha cluster up` whose active node is SIGKILLed under a running status watch.
Every wait has a deadline."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dex_ha.cli.watch import EventLines
from dex_ha.client import DexClient, SessionEvent
from dex_ha.worker import Agent, ModelRequest, ScriptedModel, ToolContext, Worker
from harness.cluster_process import LocalCluster
from harness.dev_process import DevProcess, running_dev
from harness.processes import stop
from harness.waiting import eventually
from tests.cli import clean_env, run_cli
from tests.e2e.conftest import cluster, running  # noqa: F401  (cluster: the three-node fixture)

ANSWER = "The order A17 was shipped on Monday and arrives tomorrow"
# A line of the watch: the time in UTC, the event type, its essentials.
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ  (\S+)\s*(.*)$")


def script(request: ModelRequest) -> dict[str, Any]:
    """Look the order up with a tool, then answer in words (streamed as deltas)."""
    if request.history[-1]["type"] == "user":
        return {"content": "", "tool_calls": [{"id": "look-1", "name": "lookup", "arguments": {"order": "A17"}}]}
    return {"content": ANSWER, "tool_calls": []}


def make_worker(url: str) -> Worker:
    agent = Agent("helper", model=ScriptedModel(script, delta_delay_s=0.02))

    @agent.tool(effect="read")
    async def lookup(ctx: ToolContext, order: str) -> str:
        return f"{order}: shipped"

    return Worker(url, agents=[agent], poll_wait_ms=1000)


@pytest.fixture
async def dev(tmp_path: Path) -> AsyncIterator[DevProcess]:
    async with running_dev(tmp_path) as node:
        yield node


def watch_lines(output: str) -> list[tuple[str, str]]:
    """(type, essentials) of each line of `sessions watch`; a line of another shape fails."""
    lines = []
    for line in output.splitlines():
        match = LINE.match(line)
        assert match, f"not a watch line: {line!r}"
        lines.append((match[1], match[2]))
    return lines


async def test_sessions_watch_follows_a_turn_live_and_exits_0_once_idle(dev: DevProcess, tmp_path: Path) -> None:
    env = clean_env(DEX_HA_URLS=dev.url)
    async with DexClient(dev.url) as client:
        await client.create_session("helper", session_id="s-watch")
        await client.send_message("s-watch", "where is A17?")  # no Worker yet: the turn waits for one
        out, err = tmp_path / "watch.out", tmp_path / "watch.err"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            watch = subprocess.Popen(
                [sys.executable, "-m", "dex_ha.cli", "sessions", "watch", "s-watch", "--until-idle"],
                stdout=stdout,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        try:
            # The stream is open once the replayed events are printed; the model's deltas,
            # which are never replayed, can then only reach the watch live.
            await eventually(lambda: "step_queued" in out.read_text(), "the watch to print the queued model step")
            async with running(make_worker(dev.url)):
                await eventually(lambda: watch.poll() is not None, "the watch to end with the turn", deadline_s=60)
                code = watch.returncode
        finally:
            stop(watch)
    assert code == 0, err.read_text()
    lines = watch_lines(out.read_text())
    types = [type_ for type_, _ in lines]
    assert types[:3] == ["session_created", "message_received", "turn_started"]
    assert types[-1] == "turn_completed"
    details = dict(reversed(lines))  # the first line of each type
    assert (
        details["message_received"].startswith("queue message ")
        and 'text "where is A17?"' in details["message_received"]
    )
    assert re.match(r"RunModel step \S+ attempt 1 worker \S+", details["attempt_started"])
    assert re.match(r'lookup call look-1 succeeded output "A17: shipped"', details["tool_call_finished"])
    # The answer came as one delta per word: condensed into a few lines whose text is the answer.
    deltas = [text for type_, text in lines if type_ == "delta"]
    assert 1 <= len(deltas) < len(ANSWER.split()), deltas
    texts = [re.fullmatch(r'step \S+ attempt 1 "(.*)" \(\d+ deltas?\)', d) for d in deltas]
    streamed = "".join(match[1] for match in texts if match)
    assert len(streamed) > 0 and all(texts), deltas
    assert streamed.replace("…", "") in ANSWER and streamed.startswith("The order A17")
    assert f'text "{ANSWER[:40]}' in [text for type_, text in lines if type_ == "assistant_message"][-1]

    # Afterwards: --json replays the committed events, one JSON object a line, and stops at
    # the end of the (last) turn.
    replay = run_cli("sessions", "watch", "s-watch", "--until-idle", "--json", env=env, timeout=60)
    assert replay.returncode == 0, replay.stderr
    events = [json.loads(line) for line in replay.stdout.splitlines()]
    assert [e["type"] for e in events] == [t for t in types if t != "delta"]
    assert all(e["id"] and isinstance(e["at"], int) for e in events)
    assert events[0]["data"]["agent"] == "helper" and events[-1]["data"]["turn_id"]


def test_sessions_watch_of_an_unknown_session_is_one_line_and_exit_1(dev: DevProcess) -> None:
    done = run_cli("sessions", "watch", "no-such-session", "--url", dev.url, timeout=60)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "dex-ha sessions watch: refused (404 not_found): no session 'no-such-session' in namespace 'default'"
    ]


def test_status_watch_prints_count_frames_under_a_timestamp_line(dev: DevProcess) -> None:
    done = run_cli("status", "--watch", "--count", "2", "--interval", "0.2", "--url", dev.url, timeout=60)
    assert done.returncode == 0, done.stderr
    frames = done.stdout.split("\n\n" + "dex-ha status at ")
    assert len(frames) == 2, done.stdout
    assert re.match(r"dex-ha status at \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ \(every 0.2 s; Ctrl-C stops\)\n", done.stdout)
    for frame in frames:
        assert re.search(rf"^dev\s+{re.escape(dev.url)}\s+active", frame, re.MULTILINE), frame
    assert "\033[" not in done.stdout  # not a terminal: nothing is cleared

    lines = run_cli("status", "--watch", "--count", "2", "--interval", "0.2", "--json", "--url", dev.url, timeout=60)
    frames_json = [json.loads(line) for line in lines.stdout.splitlines()]
    assert len(frames_json) == 2 and all(f["nodes"][0]["answer"]["role"] == "active" for f in frames_json)

    alone = run_cli("status", "--count", "2", "--url", dev.url, timeout=60)
    assert alone.returncode == 2 and alone.stderr.strip() == "dex-ha status: --interval and --count go with --watch"


async def test_status_watch_shows_a_killed_node_as_down_and_goes_on_through_the_failover(
    cluster: LocalCluster,  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
) -> None:
    old = await cluster.active_node()
    out = tmp_path / "status.out"
    env = clean_env(DEX_HA_TOKEN=cluster.tokens["admin"])
    with open(out, "wb") as stdout:
        watch = subprocess.Popen(
            [sys.executable, "-m", "dex_ha.cli", "status", "--watch", "--interval", "0.2", "--url", cluster.urls[old]],
            stdout=stdout,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:

        def last_frame() -> str:
            return out.read_text().rpartition("dex-ha status at ")[2]

        await eventually(lambda: f"active node: {old}" in last_frame(), "a frame with the active node")
        cluster.kill(old)

        def failed_over() -> str | None:
            frame = last_frame()
            down = re.search(rf"^{old}\s+{re.escape(cluster.urls[old])}\s+NO ANSWER", frame, re.MULTILINE)
            new = re.search(r"^active node: (n\d)", frame, re.MULTILINE)
            return frame if down and new and new[1] != old else None

        await eventually(failed_over, f"a frame with {old} down and another node active")
        assert watch.poll() is None, out.read_text()  # neither the death of its --url node nor the election ended it
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=15) == 130
    finally:
        stop(watch)
    assert "Traceback" not in out.read_text()


def test_deltas_of_one_attempt_make_one_line_until_another_event_or_a_second_passes() -> None:
    lines: list[str] = []
    now = [0.0]
    printer = EventLines(lines.append, clock=lambda: now[0], wall_ms=lambda: 0)

    def delta(text: str, attempt: int = 1) -> SessionEvent:
        return SessionEvent(None, "delta", {"text": text}, None, step_id="st1", attempt=attempt)

    for word in ("Hello ", "there "):
        printer.feed(delta(word))
    assert lines == []  # still streaming
    printer.feed(delta("again", attempt=2))  # another attempt: the first one's line is done
    now[0] = 1.5
    printer.feed(delta(" later", attempt=2))  # a second on: the line so far is printed
    printer.feed(SessionEvent("9", "attempt_failed", {"kind": "RunModel", "step_id": "st1", "attempt": 2}, 0))
    assert [line.split("  ", 2)[2].strip() for line in lines] == [
        'step st1 attempt 1 "Hello there" (2 deltas)',
        'step st1 attempt 2 "again" (1 delta)',
        'step st1 attempt 2 "later" (1 delta)',
        "RunModel step st1 attempt 2",
    ]
