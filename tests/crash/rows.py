"""The crash matrix as data, the one definition of every row: one entry per row R01–R21,
with its prose, what each failure column checks and how the process dies, and what runs
it: the agent its Worker process runs (agents.py), its real-process scenario
(scenarios.py, run by test_matrix.py) and its engine-level scenario
(tests/engine/crash_scenarios.py, run by tests/engine/test_crash_rows.py). Then the
variants of some rows (another step or load at the same moment), and the cases of "a call
that never ran" and of the one exception to at-most-once, each with its agent and scenario.

The tests take their ids, xfail marks and death notes from here, the Worker process
(worker_proc.py) its agent, and scripts/crash_matrix_doc.py renders docs/crash-matrix.md
from the same tables, so the document cannot say something the tests do not. The step
kinds that decide a row are those whose entry of dex_ha.engine.kinds.STEP_KINDS claims it
(`Row.kinds`), so the row does not restate them."""

from __future__ import annotations

from dataclasses import dataclass, field

from dex_ha.engine.kinds import STEP_KINDS, StepKind
from tests.crash import agents, scenarios
from tests.crash.agents import AgentBuilder
from tests.crash.scenarios import HANDOUT_POINT, CellScenario
from tests.engine import crash_scenarios as engine
from tests.engine.crash_scenarios import EngineScenario

COLUMNS = ("worker_kill", "server_restart", "takeover")
SIGKILL_WORKER = "SIGKILL of the worker process"
SIGKILL_NODE = "SIGKILL of the node"
SIGKILL_ACTIVE = "SIGKILL of the active node"


@dataclass(frozen=True)
class Failure:
    """One cell: how the process dies there, and what the cell checks beyond the row's outcome."""

    death: str
    checks: str = ""
    xfail: str | None = None  # the engine differs from the row: the precise reason


@dataclass(frozen=True)
class Variant:
    """More cells of a row: the same moment with another step, or under other load. Their
    test ids are the row's cell ids with a suffix (`R19-takeover-write`), so `-k
    R19-takeover` runs a cell with its variants. A variant may cover fewer columns."""

    suffix: str
    what: str  # what differs from the row's own cells
    checks: str
    cells: dict[str, Failure]
    agent: AgentBuilder
    cell: CellScenario

    def checks_in(self, column: str) -> str:
        """What the variant's cell in `column` checks: its own checks, then the cell's."""
        failure = self.cells[column]
        return f"{self.what}: {self.checks}" + (f"; {failure.checks}" if failure.checks else "")


@dataclass(frozen=True)
class Row:
    id: str
    step: str
    interrupted: str
    happens: str
    checks: str  # what every column of the row checks (ledger and snapshot)
    cells: dict[str, Failure] = field(default_factory=dict)
    variants: tuple[Variant, ...] = ()
    agent: AgentBuilder = field(kw_only=True)  # what the cell's Worker process runs
    cell: CellScenario | None = field(kw_only=True)  # its real-process scenario; None: see `cells_in`
    engine: EngineScenario | None = field(kw_only=True)  # its engine-level scenario; None: none
    cells_in: str = field(default="tests/crash/test_matrix.py", kw_only=True)  # the file of its cells

    def failure(self, column: str) -> Failure:
        return self.cells[column]

    @property
    def kinds(self) -> tuple[StepKind, ...]:
        """The step kinds whose entry of the step-kind table decides this row (none for a row
        about any step: dex_ha.engine.kinds.CROSS_KIND_ROWS)."""
        return tuple(spec.kind for spec in STEP_KINDS.values() if self.id in spec.rows)


@dataclass(frozen=True)
class Case:
    """One test (`test_case[<id>]`) of what a tool call records when its tool did not run
    or may have run, on real processes; `column` names the server it runs on (the column's
    failure only when `how` says so)."""

    id: str
    column: str
    how: str  # what the processes do
    progress: str  # the attempt_progress the call records
    records: str  # the call's status, the not-run prefix, what the model sees, the ledger
    agent: AgentBuilder
    cell: CellScenario


def same(death_by_column: dict[str, str] | None = None, checks: dict[str, str] | None = None) -> dict[str, Failure]:
    """A cell per column, each dying the column's usual way unless `death_by_column` says
    otherwise, and checking what `checks` names for its column beyond the row's checks."""
    deaths = {
        "worker_kill": SIGKILL_WORKER,
        "server_restart": SIGKILL_NODE,
        "takeover": SIGKILL_ACTIVE,
        **(death_by_column or {}),
    }
    return {column: Failure(deaths[column], (checks or {}).get(column, "")) for column in COLUMNS}


BEFORE_FIRST_HEARTBEAT = {
    "worker_kill": "exit 99 at worker.<Kind>.before-first-heartbeat (only the Worker knows that moment)",
    "server_restart": "SIGKILL of the node as soon as the ledger shows the run started; the Worker's "
    "heartbeat interval is 10 s, and the cell checks the kill came sooner",
    "takeover": "SIGKILL of the active node as soon as the ledger shows the run started; the Worker's "
    "heartbeat interval is 10 s, and the cell checks the kill came sooner",
}
WAIT_ENDED = {
    "worker_kill": "SIGKILL of the worker process while the waits are open; they end while no Worker runs",
    "server_restart": "exit 99 at server.wait.after-commit, once per wait (timer, approval, answer)",
    "takeover": "exit 99 at server.wait.after-commit on the active node, once per wait",
}
RESULT_IN_FLIGHT = {
    "worker_kill": "exit 99 at worker.complete.after-send: the tool's result was sent and accepted",
    "server_restart": "exit 99 at server.complete.before-propose: the result arrived, not yet proposed",
    "takeover": "exit 99 at server.complete.after-commit on the active node: committed, not yet answered",
}

ROWS: dict[str, Row] = {
    row.id: row
    for row in (
        Row(
            "R01",
            "RunModel",
            "before any output reaches the server",
            "The model call runs again, up to 3 attempts. Then the turn fails; if tools already ran, a note "
            "in the history tells the next turn's model not to repeat them.",
            "every attempt of the model call is interrupted in turn: 3 attempts, each failed NOT_COMPLETED; "
            "the turn fails with a note naming the tool that ran; the tool ran once (ledger); the next turn's "
            "model saw the note",
            same(),
            agent=agents.r01,
            cell=scenarios.r01,
            engine=engine.row_run_model_exhausts,
        ),
        Row(
            "R02",
            "RunModel",
            "after output (stream deltas) reached the server",
            "The same as R01. The deltas are tagged with step and attempt, so a client can drop those of "
            "the failed attempt.",
            "the client's event stream saw deltas of attempt 1 and an attempt_failed event naming that step "
            "and attempt; attempt 2 answers; the model ran twice with the same input (ledger)",
            same(),
            agent=agents.r02,
            cell=scenarios.r02,
            engine=engine.row_run_model_after_output,
        ),
        Row(
            "R03",
            "CallTool, idempotent write",
            "before the first heartbeat reaches the server",
            "The call runs again with the same idempotency key.",
            "attempts failed NOT_COMPLETED then completed; the ledger has 2 runs (attempts 1 and 2), both "
            "with the key {session}:{call}; only attempt 2 finished; the call succeeded",
            same(BEFORE_FIRST_HEARTBEAT),
            agent=agents.single_tool_row("put_item", "idempotent_write", hang_on=agents.first_attempt, beats=False),
            cell=scenarios.runs_again("put_item", before_first_heartbeat=True),
            engine=engine.row_call_tool_runs_again("put_item", 0),
        ),
        Row(
            "R04",
            "CallTool, idempotent write",
            "while the tool runs",
            "The same as R03.",
            "as R03, interrupted after a heartbeat of attempt 1 got through",
            same(),
            agent=agents.single_tool_row("put_item", "idempotent_write", hang_on=agents.first_attempt, beats=True),
            cell=scenarios.runs_again("put_item", before_first_heartbeat=False),
            engine=engine.row_call_tool_runs_again("put_item", 20_000),
        ),
        Row(
            "R05",
            "CallTool, read",
            "while the tool runs",
            "The call runs again.",
            "as R04, for a read",
            same(),
            agent=agents.single_tool_row("lookup", "read", hang_on=agents.first_attempt, beats=True),
            cell=scenarios.runs_again("lookup", before_first_heartbeat=False),
            engine=engine.row_call_tool_runs_again("lookup", 20_000),
        ),
        Row(
            "R06",
            "CallTool",
            "every attempt",
            "After the last attempt, a read records failed and a write records outcome_unknown.",
            "each of the 3 attempts of a read and an idempotent write is interrupted; the read records "
            "failed, the write outcome_unknown, both NOT_COMPLETED and without the not-run prefix; 3 ledger "
            "runs each, one key each; the next model call saw failed and outcome_unknown",
            same(),
            agent=agents.r06,
            cell=scenarios.r06,
            engine=engine.row_call_tool_every_attempt,
        ),
        Row(
            "R07",
            "CallSingleAttemptTool",
            "before the first heartbeat reaches the server",
            "The call records outcome_unknown and does not run again. The model sees that the outcome is unknown.",
            "one attempt, failed NOT_COMPLETED; the call records outcome_unknown without the not-run prefix; "
            "one ledger run that never finished; the next model call saw outcome_unknown",
            same(BEFORE_FIRST_HEARTBEAT),
            agent=agents.single_tool_row("send_email", "write", hang_on=agents.first_attempt, beats=False),
            cell=scenarios.single_attempt(before_first_heartbeat=True),
            engine=engine.row_single_attempt(0),
        ),
        Row(
            "R08",
            "CallSingleAttemptTool",
            "while the tool runs",
            "The same as R07.",
            "as R07, interrupted after a heartbeat of the attempt got through",
            same(),
            agent=agents.single_tool_row("send_email", "write", hang_on=agents.first_attempt, beats=True),
            cell=scenarios.single_attempt(before_first_heartbeat=False),
            engine=engine.row_single_attempt(20_000),
        ),
        Row(
            "R09",
            "AwaitToolApproval",
            "while it waits",
            "Nothing runs again; the wait lives in the server. A later approval runs the tool once.",
            "the approval is still pending after the failure and the tool has not run (ledger 0); after "
            "the approval it ran once with the call's key; approving again is a no-op",
            same(),
            agent=agents.r09,
            cell=scenarios.r09,
            engine=engine.row_approval,
        ),
        Row(
            "R10",
            "AwaitQuestionAnswer",
            "while it waits",
            "Nothing runs again. A later answer resumes the turn.",
            "both questions (the model's ask_user, and a tool's own question) are still pending after the "
            "failure; the tool ran once before (ledger); after the answers ask_user records the answer and "
            "the tool runs again with it, same key",
            same(),
            agent=agents.r10,
            cell=scenarios.r10,
            engine=engine.row_question,
        ),
        Row(
            "R11",
            "AwaitTimer",
            "while it waits",
            "Nothing runs again. The timer fires once; a timer that came due during an outage fires when "
            "the server is back.",
            "the sleep call succeeds; the event stream shows the timer fired once; the next model call saw one result",
            same(
                checks={
                    "worker_kill": "the timer fires while no Worker runs",
                    "server_restart": "the node stays down until the timer is overdue; it fires after the restart",
                    "takeover": "the new active node fires it (whether it came due during the election "
                    "depends on timing)",
                }
            ),
            agent=agents.r11,
            cell=scenarios.r11,
            engine=engine.row_timer,
        ),
        Row(
            "R12",
            "PollToolTask",
            "between two polls",
            "Polling goes on with the same task. No second task starts.",
            "the failure comes after the first poll (pending) was recorded; the task started once (ledger), "
            "both polls used its handle, no poll attempt failed",
            same(),
            agent=agents.r12,
            cell=scenarios.r12,
            engine=engine.row_poll_between,
        ),
        Row(
            "R13",
            "PollToolTask",
            "during a poll",
            "The poll runs again. No second task starts.",
            "the poll step's attempts: failed NOT_COMPLETED, then completed; the task started once; both "
            "polls (ledger) used the same handle",
            same(
                {
                    "worker_kill": "exit 99 at worker.PollToolTask.during-poll (the poll ran; its answer was "
                    "not delivered)"
                }
            ),
            agent=agents.r13,
            cell=scenarios.r13,
            engine=engine.row_poll_during,
        ),
        Row(
            "R14",
            "CompactContext",
            "during the summary call",
            "Only the summary call runs again (up to 3 attempts; if all fail the turn fails and the next "
            "message compacts again). The session stores one summary.",
            "the summary call ran twice with the same input, the model calls once each (ledger); one "
            "summary_updated event; the stored summary is the one the next model call saw. (Exhausting the "
            "3 attempts is covered by R01 and R06 for the retry rule and by the engine tests for compaction.)",
            same(),
            agent=agents.r14,
            cell=scenarios.r14,
            engine=engine.row_compaction,
        ),
        Row(
            "R15",
            "AwaitUserMessage",
            "while the session is idle",
            "Nothing runs again. The next message starts a turn.",
            "the session is idle with no step running after the failure; the next message's turn completes; "
            "one model call per turn (ledger)",
            same({"worker_kill": "SIGKILL of the worker process while the session is idle"}),
            agent=agents.r15,
            cell=scenarios.r15,
            engine=engine.row_idle,
        ),
        Row(
            "R16",
            "any step",
            "queued, before the server hands it to a Worker",
            "The step stays in the queue and uses no attempt. It runs as attempt 1 when a Worker takes it.",
            "a model step queued while no Worker runs keeps 0 attempts across the failure and then runs as "
            "attempt 1, once (ledger)",
            same({"worker_kill": "SIGKILL of the worker process; the message is sent while none runs"}),
            (
                Variant(
                    "busy",
                    "steps queued behind a busy Worker instead of while none runs",
                    "the queued model steps of two sessions kept 0 attempts across the kill and ran as "
                    "attempt 1, once each (ledger); the write that ran follows R04: attempt 1 failed "
                    "NOT_COMPLETED, attempt 2 ran with the same key and completed",
                    {
                        "worker_kill": Failure(
                            "SIGKILL of a Worker with max_concurrency 1 while it runs one session's idempotent "
                            "write and two other sessions' model steps wait in the queue behind it"
                        )
                    },
                    agents.r16_busy,
                    scenarios.r16_busy,
                ),
            ),
            agent=agents.r15,
            cell=scenarios.r16,
            engine=engine.row_queued,
        ),
        Row(
            "R17",
            "CallTool read, PollToolTask, CompactContext",
            "before the first heartbeat reaches the server",
            "The same as the rows of those steps (R05, R13, R14).",
            "a read, a poll and a summary call are each interrupted before their first heartbeat: each runs "
            "again once (same key for the read, same handle for the poll, one task, one summary)",
            same(BEFORE_FIRST_HEARTBEAT),
            agent=agents.r17,
            cell=scenarios.r17,
            engine=engine.row_before_first_heartbeat,
        ),
        Row(
            "R18",
            "AwaitToolApproval, AwaitQuestionAnswer, AwaitTimer",
            "after the wait ended, while the turn moves on",
            "The resolved approval, answer or timer stays recorded; what moves the turn on runs (again).",
            "in dex-ha the entry that ends a wait also queues what moves the turn on (one committed entry), "
            "so the moment between the two does not exist; the nearest real one is right after that entry "
            "applied, before the leader services hear of it (no answer to the client, no hand-out of the "
            "queued step). Each resolution stays recorded: the client's retried approval and answer are "
            "no-ops, the timer fired once, the approved tool ran once (ledger), the turn completes",
            same(WAIT_ENDED),
            agent=agents.r18,
            cell=scenarios.r18,
            engine=engine.row_wait_ended,
        ),
        Row(
            "R19",
            "any task step",
            "after the Worker sent the result, before the server committed it",
            "The server either commits the result or fails the attempt; a failed attempt follows its row.",
            "",
            {
                "worker_kill": Failure(
                    RESULT_IN_FLIGHT["worker_kill"],
                    "the result is committed: one ledger run, one completed attempt; a Worker "
                    "kill cannot fall between the server's receipt and its commit, which does "
                    "not depend on the Worker",
                ),
                "server_restart": Failure(
                    RESULT_IN_FLIGHT["server_restart"],
                    "the attempt fails NOT_COMPLETED and the read runs again with the same key (2 ledger runs)",
                ),
                "takeover": Failure(
                    RESULT_IN_FLIGHT["takeover"],
                    "the result stands; the Worker's retry to the new active node is accepted; "
                    "one ledger run, one completed attempt",
                ),
            },
            (
                Variant(
                    "write",
                    "a single-attempt write (CallSingleAttemptTool) instead of a read",
                    "the tool never runs again (one ledger run, finished); the call either commits its "
                    "result or records outcome_unknown",
                    {
                        "worker_kill": Failure(
                            RESULT_IN_FLIGHT["worker_kill"],
                            "committed: the call succeeded, one completed attempt; the new Worker runs nothing",
                        ),
                        "server_restart": Failure(
                            RESULT_IN_FLIGHT["server_restart"],
                            "not committed: the attempt failed NOT_COMPLETED, the call records outcome_unknown "
                            "without the not-run prefix, and the next model call saw outcome_unknown",
                        ),
                        "takeover": Failure(
                            RESULT_IN_FLIGHT["takeover"],
                            "committed: the result stands, the Worker's retry to the new active node is "
                            "accepted; the call succeeded, one completed attempt",
                        ),
                    },
                    agents.single_tool_row("send_email", "write", hang_on=agents.never, beats=False),
                    scenarios.r19_write,
                ),
            ),
            agent=agents.single_tool_row("lookup", "read", hang_on=agents.never, beats=False),
            cell=scenarios.r19,
            engine=engine.row_result_not_committed,
        ),
        Row(
            "R20",
            "a tool the framework cannot defer (inline)",
            "while it runs",
            "The tool runs inside RunModel and repeats when RunModel runs again: at-least-once.",
            "the inline tool ran twice (ledger), the RunModel attempts failed NOT_COMPLETED then completed; "
            "the call succeeded with step kind RunModel",
            same(),
            agent=agents.r20,
            cell=scenarios.r20,
            engine=engine.row_inline,
        ),
        Row(
            "R21",
            "a Claude Agent SDK turn segment (the Claude Code CLI inside RunModel)",
            "while it runs",
            "Deferred custom tools run in their own tool steps, as above. The CLI's model calls and its tools "
            "(Bash, Write, Edit, Task, ...) run inside RunModel and repeat when it runs again: at-least-once.",
            "the segment ran Bash, then hung in its second model call; the RunModel attempt failed "
            "NOT_COMPLETED and ran again, Bash with it (2 lines in the file it appends to; the fake model API "
            "saw the segment's calls twice); the deferred write tool ran once, after the failure, as its own "
            "CallSingleAttemptTool step with the call's key (ledger); no CLI process outlived its segment "
            "(tests/crash/test_r21.py)",
            same(),
            agent=agents.r21,
            cell=None,  # its cells need the fake model API and the Claude Code CLI
            engine=None,  # to the engine a segment is a RunModel attempt: R20's scenario
            cells_in="tests/crash/test_r21.py",
        ),
    )
}


# The seed's "a call that never ran": NOT_STARTED records failed with the not-run prefix
# (dex_ha.TOOL_CALL_NOT_RUN_ERROR_PREFIX); a hand-out that was committed is NOT_COMPLETED,
# conservative, even when the task never reached a Worker.
NEVER_RAN: tuple[Case, ...] = (
    Case(
        "worker-refused",
        "worker_kill",
        "the Worker refuses the arguments of a single-attempt write before it calls the tool "
        "function, and reports the attempt not_started (no failure)",
        "NOT_STARTED",
        "failed, the error starts with the not-run prefix and says why the arguments were refused; the "
        "next model call saw that error; the tool never ran (ledger 0)",
        agents.never_ran,
        scenarios.worker_refused,
    ),
    *(
        Case(
            f"handout-lost-{column}",
            column,
            f"{who} commits the hand-out of a single-attempt write, then exits (99 at {HANDOUT_POINT}) "
            f"before the task reaches the Worker; {after}",
            "NOT_COMPLETED",
            "outcome_unknown without the not-run prefix (the hand-out was committed: the server cannot know "
            "that the tool did not run); the next model call saw outcome_unknown; the tool never ran and "
            "never runs (ledger 0)",
            agents.never_ran,
            scenarios.handout_lost,
        )
        for column, who, after in (
            ("server_restart", "the node", "it restarts on its data directory"),
            ("takeover", "the active node", "a hot standby takes the lease"),
        )
    ),
    Case(
        "denied",
        "worker_kill",
        "the user denies, with a reason, the approval a single-attempt write waits for (no failure)",
        "NOT_STARTED",
        "failed, the error is the not-run prefix, then the denial and its reason; the next model call "
        "saw that error; the tool never ran (ledger 0)",
        agents.never_ran,
        scenarios.denied,
    ),
)

# The one exception to at-most-once: a cancelled attempt that keeps running.
KEEPS_RUNNING: tuple[Case, ...] = (
    Case(
        "cancel-heard",
        "worker_kill",
        "the turn is cancelled while a single-attempt write runs in a thread that cannot be interrupted; "
        "the Worker hears of the cancel in its next heartbeat answer, stops waiting for the tool and "
        "reports the attempt stopped (no failure)",
        "NOT_COMPLETED",
        "outcome_unknown without the not-run prefix, the turn cancelled, the attempt failed; then the tool "
        "finishes anyway (ledger: one run, finished after the attempt failed) and its result is dropped in "
        "the Worker; the next turn's model saw outcome_unknown",
        agents.keeps_running,
        scenarios.cancel_heard,
    ),
    Case(
        "cancel-late-result",
        "server_restart",
        "the same, but the tool finishes before the Worker hears of the cancel (its heartbeats are 10 s "
        "apart), so the Worker sends the result (no failure)",
        "NOT_COMPLETED",
        "the late result is accepted (200) and the attempt records completed, but the call keeps the "
        "outcome_unknown it recorded at the cancel, without the output; ledger: one run, finished",
        agents.keeps_running,
        scenarios.cancel_late_result,
    ),
)
CASES: dict[str, Case] = {case.id: case for case in (*NEVER_RAN, *KEEPS_RUNNING)}

# The Worker-kill cells that also run with the TypeScript Worker (tests/crash/test_ts_cells.py):
# the Python cell's scenario with the row's TypeScript agent. R17, R18, R20, R21: Python only.
TS_COLUMN = "worker_kill"
TS_ROW_IDS: tuple[str, ...] = (*(f"R{n:02d}" for n in range(1, 17)), "R19")


@dataclass(frozen=True)
class TsCell:
    """One TypeScript cell: `scenario` names the Python cell's scenario (a row id, or
    `{row}-{suffix}` for a variant); `test_id` is its pytest id (`R16-worker_kill-busy-ts`)."""

    scenario: str
    test_id: str
    failure: Failure
    checks: str


def ts_cells() -> list[TsCell]:
    """The TypeScript cells in order: each row's, then its Worker-kill variants'."""
    cells = []
    for row_id in TS_ROW_IDS:
        row = ROWS[row_id]
        failure = row.failure(TS_COLUMN)
        cells.append(TsCell(row_id, f"{row_id}-{TS_COLUMN}-ts", failure, failure.checks))
        for variant in row.variants:
            if TS_COLUMN in variant.cells:
                test_id = f"{row_id}-{TS_COLUMN}-{variant.suffix}-ts"
                scenario = f"{row_id}-{variant.suffix}"
                cells.append(TsCell(scenario, test_id, variant.cells[TS_COLUMN], variant.checks_in(TS_COLUMN)))
    return cells


@dataclass(frozen=True)
class CellRun:
    """What a cell key runs: the agent of the cell's Worker process, and its scenario."""

    agent: AgentBuilder
    scenario: CellScenario | None


def cell_runs() -> dict[str, CellRun]:
    """Every cell key: a row id, `{row}-{suffix}` for a variant, or a case id. The key names
    the scenario a test runs and the agent its Worker process builds (worker_proc.py's
    `--row`; the TypeScript Worker's agents use the same keys)."""
    runs = {}
    for row in ROWS.values():
        runs[row.id] = CellRun(row.agent, row.cell)
        for variant in row.variants:
            runs[f"{row.id}-{variant.suffix}"] = CellRun(variant.agent, variant.cell)
    for case in CASES.values():
        runs[case.id] = CellRun(case.agent, case.cell)
    return runs


CELL_RUNS: dict[str, CellRun] = cell_runs()
