"""Crash-matrix row R21: a Claude Agent SDK turn segment, interrupted while it runs, in the
three failure columns (`test_cell[R21-worker_kill]`, `[R21-server_restart]`, `[R21-takeover]`:
the ids of the matrix in test_matrix.py, so that docs/crash-matrix.md lists them with the rest).
The row (tests/crash/rows.py) names its agent, which the crash cells' Worker process runs.

The agent (tests/support/claude_segment.py) runs the real Claude Code CLI against the fake
Anthropic API, which lives in this test process and records every request. Its first
segment calls Bash (inline: a line appended to inline.log), then the model again, which
hangs before it answers put_record (a deferred tool, effect write). The failure comes
while it hangs. Outcome of the row: the RunModel attempt fails and runs again, and with it
the inline work (Bash writes its line again; the fake sees the segment's model calls
twice); the deferred tool runs once, as its own step, after the repeated segment.

Evidence from outside the server: inline.log, the fake API's request record, the crash
ledger the Worker process writes, the session snapshot and events, and /proc: no CLI of a
segment outlives it (a killed Worker's CLI dies with it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.fake_models.anthropic_api import FakeAnthropic
from harness.waiting import eventually
from tests.crash.cell import COMPLETED, FAILED, Cell, call_of
from tests.crash.columns import Column
from tests.crash.rows import COLUMNS
from tests.support.claude_segment import (
    DEFERRED_TOOL,
    FINAL_TEXT,
    ScriptedCoder,
    cli_missing_reason,
    inline_runs,
    stage,
)

pytestmark = pytest.mark.skipif(cli_missing_reason() is not None, reason=str(cli_missing_reason()))

ROW = "R21"
DEADLINE_S = 60.0  # a segment starts a CLI (a second or two on a loaded machine) per attempt


class R21Cell(Cell):
    """A cell whose Worker process runs the row's agent (the Claude coder) against the fake
    Anthropic API at `api_url`, its CLI working in `work_dir`. It dies by SIGKILL only."""

    def __init__(self, column: Column, directory: Path, api_url: str) -> None:
        super().__init__(ROW, column, directory)
        self.work_dir = directory / "work"
        self.work_dir.mkdir()
        self.agent_args = ["--api-url", api_url, "--work-dir", str(self.work_dir)]


async def r21(cell: R21Cell, fake: FakeAnthropic) -> None:
    cell.start_worker()
    await cell.send("Write the file, then store the record.")
    await eventually(
        lambda: fake.stalls == 1 and inline_runs(cell.work_dir) == 1,
        "segment 1 to run Bash, then hang in its second model call",
        DEADLINE_S,
    )
    await cell.fail()
    if cell.worker_kill:  # the dead Worker's CLI did not run on (dex_ha.adapters.claude_launcher)
        await eventually(lambda: not processes_in(cell.work_dir), "the killed Worker's CLI to end", DEADLINE_S)
    await cell.recover()
    snap = await cell.idle()
    await eventually(lambda: not processes_in(cell.work_dir), "every segment's CLI to end", DEADLINE_S)

    user, segment, result, final = snap["history"]
    call_id = segment["tool_calls"][0]["id"]
    assert (snap["turns"][0]["status"], final["content"]) == ("completed", FINAL_TEXT)
    # At-least-once inside RunModel: the attempt failed and ran again, Bash and model calls with it.
    assert cell.step_attempts("RunModel") == [FAILED, COMPLETED, COMPLETED]
    assert inline_runs(cell.work_dir) == 2
    assert [stage(body) for body in fake.bodies()] == [1, 2, 1, 2, 3]
    # The deferred tool: once, as its own single-attempt step, after the repeated segment.
    assert segment["tool_calls"] == [{"id": call_id, "name": DEFERRED_TOOL, "arguments": {"key": "k1", "value": "v1"}}]
    call = call_of(snap, call_id)
    assert (call["status"], call["step_kind"]) == ("succeeded", "CallSingleAttemptTool")
    assert (result["type"], result["call_id"], result["status"]) == ("tool_result", call_id, "succeeded")
    started = cell.ledger.runs("tool", DEFERRED_TOOL, "started")
    assert [(run.key, run.attempt) for run in started] == [(f"{cell.sid}:{call_id}", 1)]
    assert started[0].at > cell.failed_at[0]  # it ran after the failure, in the repeated segment's turn
    assert len(cell.ledger.runs("tool", DEFERRED_TOOL, "finished")) == 1


def processes_in(directory: Path) -> list[int]:
    """The pids of the processes whose working directory is `directory`: the CLIs of the cell's
    segments and the commands they run."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cwd").resolve() == directory.resolve():
                pids.append(int(proc.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return pids


@pytest.mark.parametrize("column_name", [pytest.param(c, id=f"R21-{c}") for c in COLUMNS])
async def test_cell(column_name: str, columns: dict[str, Column], tmp_path: Path) -> None:
    column = columns[column_name]
    await column.ready()
    async with FakeAnthropic(responder=ScriptedCoder(tmp_path / "work", stall_once=True)) as fake:
        cell = R21Cell(column, tmp_path, fake.base_url)
        try:
            await cell.open()
            await r21(cell, fake)
        finally:
            await cell.close()
