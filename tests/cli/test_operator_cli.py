"""The operator CLI against a real `dex-ha cluster up`: the environment tokens.env sets,
`status` without a token, `members` (list, "never", progress) and `sessions …`.

The `dex-ha` commands run as subprocesses, as a user runs them. The Worker and the
DexClient that make the sessions run in this process and are built with no URL and no
token: they read DEX_HA_URLS and DEX_HA_WORKER_TOKEN / DEX_HA_CLIENT_TOKEN, as after
`source tokens.env`. One cluster serves the module (starting one takes seconds); tests run
in file order.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from dex_ha.cli.members import contact_text_of, format_members, progress_text_of
from dex_ha.cli.remote import NodeAnswer
from dex_ha.cli.status import format_status
from dex_ha.client import DexClient, Session
from dex_ha.local_cluster import start_node
from dex_ha.worker import Agent, ModelRequest, ScriptedModel, ToolContext, Worker
from harness.cluster_process import LocalCluster, add_member_args, cluster_up, plan_joiner
from harness.dev_process import DevProcess
from harness.waiting import eventually
from tests.cli import clean_env, run_cli, stop, wait_until
from tests.e2e.conftest import running

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"

EXPORT = re.compile(r"^export (DEX_HA_[A-Z_]+)=(\S+)$", re.MULTILINE)


def tokens_env_vars(cluster_dir: Path) -> dict[str, str]:
    """The variables that `source DIR/tokens.env` sets."""
    return dict(EXPORT.findall((cluster_dir / "tokens.env").read_text()))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with cluster_up(tmp_path_factory.mktemp("opcli") / "cluster") as local:
        yield local


@pytest.fixture
def sourced(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This process's environment as after `source tokens.env`; returns the variables."""
    variables = tokens_env_vars(cluster.dir)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    return variables


def cli(*args: str, env: dict[str, str]) -> Any:
    return run_cli(*args, env=clean_env(**env), timeout=60)


# ---------------------------------------------------------------- tokens.env and status


def test_tokens_env_holds_the_urls_and_a_token_per_role(cluster: LocalCluster) -> None:
    variables = tokens_env_vars(cluster.dir)
    assert variables["DEX_HA_URLS"].split(",") == list(cluster.urls.values())
    assert variables["DEX_HA_TOKEN"] == cluster.tokens["admin"]
    assert variables["DEX_HA_CLIENT_TOKEN"] == cluster.tokens["client"]
    assert variables["DEX_HA_WORKER_TOKEN"] == cluster.tokens["worker"]


def test_status_without_a_token_says_401_and_how_to_fix_it(cluster: LocalCluster) -> None:
    done = cli("status", "--url", cluster.urls["n1"], env={})
    assert done.returncode == 1
    assert "401 unauthorized: set DEX_HA_TOKEN or pass --token" in done.stdout
    assert "NO active node" not in done.stdout  # it is not an election
    assert "401 unauthorized: set DEX_HA_TOKEN or pass --token" in done.stderr


def test_status_blames_the_token_when_nodes_refuse_it_even_with_one_node_down() -> None:
    refused = "401 unauthorized: set DEX_HA_TOKEN or pass --token (the server said: unknown token)"
    answers = [
        NodeAnswer("http://h1:8801", error="no answer"),
        NodeAnswer("http://h2:8801", error=refused, refused=True, status=401),
        NodeAnswer("http://h3:8801", error=refused, refused=True, status=401),
    ]
    text = format_status(answers)
    assert "\n401 unauthorized: set DEX_HA_TOKEN or pass --token\n" in text and "NO active node" not in text
    forbidden = [NodeAnswer("http://h1:8801", error="refused (403 forbidden): …", refused=True, status=403)]
    assert "401 unauthorized" not in format_status(forbidden)  # another refusal: no token advice


def test_status_with_no_flags_reads_dex_ha_urls_and_dex_ha_token(cluster: LocalCluster) -> None:
    done = cli("status", env=tokens_env_vars(cluster.dir))
    assert done.returncode == 0, done.stdout + done.stderr
    for node_id, url in cluster.urls.items():
        assert re.search(rf"^{node_id}\s+{re.escape(url)}\s+(active|standby)", done.stdout, re.MULTILINE)
    assert "active node: n" in done.stdout


def test_url_may_be_comma_separated(cluster: LocalCluster) -> None:
    variables = tokens_env_vars(cluster.dir)
    done = cli("status", "--json", "--url", variables["DEX_HA_URLS"], env={"DEX_HA_TOKEN": variables["DEX_HA_TOKEN"]})
    assert done.returncode == 0, done.stderr
    asked = [node["url"] for node in json.loads(done.stdout)["nodes"]]
    assert asked[:3] == list(cluster.urls.values())


def test_a_malformed_url_in_dex_ha_urls_is_a_usage_error(cluster: LocalCluster) -> None:
    done = cli("status", env={"DEX_HA_URLS": f"{cluster.urls['n1']},127.0.0.1:1"})
    assert done.returncode == 2
    assert "DEX_HA_URLS: expected http://host:port, got '127.0.0.1:1'" in done.stderr


# ---------------------------------------------------------------- members


def member_rows(output: str) -> dict[str, str]:
    """The lines of a members table by member id."""
    return {line.split()[0]: line for line in output.splitlines()[1:] if line.strip()}


def test_members_without_a_subcommand_lists_them_and_list_does_too(cluster: LocalCluster) -> None:
    env = tokens_env_vars(cluster.dir)
    bare, listed = cli("members", env=env), cli("members", "list", env=env)
    for done in (bare, listed):
        assert done.returncode == 0, done.stderr
        header = done.stdout.splitlines()[0].split()
        assert header == ["member", "kind", "url", "match", "applied", "last", "contact", "progress"]
        rows = member_rows(done.stdout)
        assert sorted(rows) == ["n1", "n2", "n3"]
        assert all(" voter " in row for row in rows.values())
        # The leader's own row says so; the others have answered it and are caught up.
        assert sum(row.endswith("leader") for row in rows.values()) == 1
        assert sum(row.endswith("caught up") for row in rows.values()) == 2
        assert all(re.search(r"\d+ ms ago", row) for row in rows.values())


def test_a_member_added_but_never_started_shows_never_until_it_starts_and_catches_up(cluster: LocalCluster) -> None:
    env = tokens_env_vars(cluster.dir)
    joiner = plan_joiner(cluster)
    added = cli("members", *add_member_args(joiner), env=env)
    n4 = None
    try:
        assert added.returncode == 0, added.stderr
        # Asked twice with time between: "never" stays, where a made-up contact time would grow.
        for _ in range(2):
            done = cli("members", "--url", cluster.urls["n2"], env=env)
            assert done.returncode == 0, done.stderr
            row = member_rows(done.stdout)["n4"]
            assert " learner " in row and " never " in row and "ms ago" not in row, done.stdout
            assert row.endswith("not reached yet (is it running?)")
        n4 = start_node(joiner)

        def n4_caught_up() -> str | None:
            row = member_rows(cli("members", env=env).stdout).get("n4", "")
            return row if re.search(r"\d+ ms ago +caught up$", row) else None

        wait_until(n4_caught_up, 30, "n4 to answer the leader and catch up")
    finally:
        if n4 is not None:
            stop(n4)
        removed = cli("members", "remove", "n4", env=env)
        assert removed.returncode == 0, removed.stderr
    assert "n4" not in member_rows(cli("members", env=env).stdout)


def test_progress_shows_snapshot_bytes_then_the_applied_index_against_the_commit_index() -> None:
    learner = {
        "id": "n4",
        "voter": False,
        "url": "http://n4:8801",
        "match_index": 0,
        "last_contact_ms_ago": 3,
        "contacted": True,
        "replication": "snapshot",
        "snapshot_bytes": [3 << 20, 12 << 20],
    }
    assert progress_text_of(learner, 5000) == "snapshot 3.0 MiB of 12.0 MiB (25%)"
    received = {**learner, "snapshot_bytes": None}  # all sent; the learner has not acknowledged it yet
    assert progress_text_of(received, 5000) == "snapshot sent, applying (match 0 of 5000)"
    replicating = {**received, "replication": "replicate", "match_index": 4200, "applied_index": 4100}
    assert progress_text_of(replicating, 5000) == "catching up: applied 4100 of 5000 (900 behind)"
    # Stored is not caught up: only once it applied every committed entry.
    stored = {**replicating, "match_index": 5000}
    assert progress_text_of(stored, 5000) == "catching up: applied 4100 of 5000 (900 behind)"
    assert progress_text_of({**stored, "applied_index": 5000}, 5000) == "caught up"
    assert progress_text_of({**stored, "applied_index": None}, 5000) == "caught up"  # a server of the release before
    table = format_members([{**learner, "applied_index": 0}], 5000).splitlines()
    assert table[1].split()[:5] == ["n4", "learner", "http://n4:8801", "0", "0"]
    assert re.search(r"3 ms ago +snapshot 3.0 MiB of 12.0 MiB \(25%\)$", table[1])


def test_progress_says_a_member_lost_entries_until_it_has_them_again() -> None:
    wiped = {
        "id": "n3",
        "voter": True,
        "match_index": 0,
        "applied_index": 0,
        "contacted": True,
        "replication": "probe",
        "lost_entries": 1,
        "lost_acknowledged_index": 59,
    }
    text = progress_text_of(wiped, 61)
    assert text.startswith("LOST ENTRIES: had stored up to 59, has 0") and "caught up" not in text
    recovered = {**wiped, "match_index": 61, "applied_index": 61, "lost_acknowledged_index": None}
    assert progress_text_of(recovered, 61) == "caught up (lost entries 1x this term)"


def test_last_contact_is_never_only_when_the_leader_says_so() -> None:
    assert contact_text_of({"contacted": False, "last_contact_ms_ago": None}) == "never"
    assert contact_text_of({"contacted": None, "last_contact_ms_ago": None}) == "-"  # a follower's view: unknown
    assert contact_text_of({"contacted": True, "last_contact_ms_ago": 12}) == "12 ms ago"
    assert contact_text_of({"last_contact_ms_ago": 7}) == "7 ms ago"  # a node of an older version


# ---------------------------------------------------------------- sessions


def script(request: ModelRequest) -> dict[str, Any]:
    """Turn 1: a refund that needs approval and a question; turn 2: a charge that fails
    mid-call (outcome_unknown) and a refund that the operator denies."""
    last = request.history[-1]
    turn = sum(item["type"] == "user" for item in request.history)
    if last["type"] != "user":
        return {"content": f"turn {turn} done", "tool_calls": []}
    if turn == 1:
        return {
            "content": "",
            "tool_calls": [
                {"id": "refund-1", "name": "refund", "arguments": {"order_id": "A17"}},
                {"id": "ask-1", "name": "pick_color", "arguments": {}},
            ],
        }
    return {
        "content": "",
        "tool_calls": [
            {"id": "charge-2", "name": "charge", "arguments": {"cents": 500}},
            {"id": "refund-2", "name": "refund", "arguments": {"order_id": "B2"}},
        ],
    }


def make_agent() -> Agent:
    agent = Agent("ops", model=ScriptedModel(script))

    @agent.tool(effect="write", approval=True)
    async def refund(ctx: ToolContext, order_id: str) -> str:
        return f"refunded {order_id}"

    @agent.tool(effect="read")
    async def pick_color(ctx: ToolContext) -> str:
        return f"color {await ctx.ask('which color?')}"

    @agent.tool(effect="write")
    async def charge(ctx: ToolContext, cents: int) -> str:
        raise RuntimeError("connection reset while charging")  # did it charge? nobody knows

    return agent


@pytest.fixture
async def worker(sourced: dict[str, str]) -> AsyncIterator[Worker]:
    async with running(Worker(agents=[make_agent()], poll_wait_ms=1000)) as started:
        yield started


async def snapshot_when(client: DexClient, sid: str, check: Any, what: str) -> Session:
    async def ready() -> Session | None:
        snapshot = await client.get_session(sid)
        return snapshot if check(snapshot) else None

    return await eventually(ready, what, deadline_s=30)


def call_status(snapshot: Session, call_id: str) -> str:
    return snapshot.tool_call(call_id).status


async def test_sessions_commands_drive_a_session_through_approval_question_deny_and_reconcile(
    sourced: dict[str, str], worker: Worker
) -> None:
    env = sourced
    async with DexClient(give_up_after_s=30) as client:  # DEX_HA_URLS and DEX_HA_CLIENT_TOKEN
        sid = (await client.create_session("ops", session_id="s-ops-1")).session_id
        await client.create_session("ops", session_id="s-ops-0")
        sent = cli("sessions", "send", sid, "refund A17 please", env=env)
        assert sent.returncode == 0 and f"sent to {sid}" in sent.stdout, sent.stderr
        await snapshot_when(
            client, sid, lambda s: s.pending_approvals and s.pending_questions, "the approval and the question"
        )

        shown = cli("sessions", "show", sid, env=env)
        assert shown.returncode == 0, shown.stderr
        approvals = shown.stdout.split("pending approvals")[1]
        assert re.search(r"^refund-1\s+refund\s+\{\"order_id\": \"A17\"\}", approvals, re.MULTILINE)
        assert "which color?" in shown.stdout.split("pending questions")[1]
        steps = shown.stdout.split("turns (1):")[1]  # the running turn's steps with their attempts
        assert re.search(r"^turn 1 \S+  running", steps, re.MULTILINE)
        assert re.search(r"^  \S+\s+RunModel\s+done\s+-\s+-\s+1/3\s+#1 completed", steps, re.MULTILINE)
        assert re.search(r"^  \S+\s+AwaitToolApproval\s+waiting\s+refund-1", steps, re.MULTILINE)
        assert "#1 user:\n  refund A17 please" in shown.stdout.split("conversation")[1]

        question_id = json.loads(cli("sessions", "show", sid, "--json", env=env).stdout)["pending_questions"][0][
            "question_id"
        ]
        assert cli("sessions", "approve", sid, "refund-1", env=env).returncode == 0
        answered = cli("sessions", "answer", sid, question_id, "blue", env=env)
        assert answered.returncode == 0 and "answered" in answered.stdout, answered.stderr
        done = await snapshot_when(client, sid, lambda s: s.status == "idle", "turn 1 to end")
        assert call_status(done, "refund-1") == "succeeded"
        assert done.tool_call("ask-1").output == "color blue"

        assert cli("sessions", "send", sid, "charge and refund B2", env=env).returncode == 0
        await snapshot_when(client, sid, lambda s: s.pending_approvals, "the second approval")
        denied = cli("sessions", "deny", sid, "refund-2", "--reason", "not this one", env=env)
        assert denied.returncode == 0 and "denied" in denied.stdout, denied.stderr
        unknown = await snapshot_when(client, sid, lambda s: s.status == "idle", "turn 2 to end")
        assert call_status(unknown, "refund-2") == "failed"
        assert call_status(unknown, "charge-2") == "outcome_unknown"
        assert "outcome_unknown: check what the tool did" in cli("sessions", "show", sid, env=env).stdout

        settled = cli(
            "sessions",
            "reconcile",
            sid,
            "charge-2",
            "--outcome",
            "succeeded",
            "--result",
            '"charged"',
            "--json",
            env=env,
        )
        assert settled.returncode == 0, settled.stderr
        assert json.loads(settled.stdout)["noop"] is False  # the server's answer, as JSON
        after = await client.get_session(sid)
        assert call_status(after, "charge-2") == "succeeded"

    # Listing, newest first (s-ops-0 was created last): a page of one says where the next
    # page starts (after s-ops-0's creation time and id); --all follows the cursor.
    first = cli("sessions", "list", "--agent", "ops", "--limit", "1", env=env)
    assert first.returncode == 0, first.stderr
    assert re.search(r"^s-ops-0\s+ops\s+idle\s+0\s", first.stdout, re.MULTILINE)
    cursor = re.search(r"more: dex-ha sessions list --after (\d+:s-ops-0)\b", first.stdout)
    assert cursor, first.stdout
    second = cli("sessions", "list", "--agent", "ops", "--limit", "1", "--after", cursor[1], env=env)
    assert re.search(rf"^{sid}\s+ops\s+idle\s+2\s", second.stdout, re.MULTILINE)
    every = json.loads(cli("sessions", "list", "--agent", "ops", "--limit", "1", "--all", "--json", env=env).stdout)
    assert [s["session_id"] for s in every["sessions"]] == ["s-ops-0", sid] and every["next_after"] is None


def test_sessions_errors_are_one_line_with_an_exit_code(cluster: LocalCluster) -> None:
    env = tokens_env_vars(cluster.dir)
    missing = cli("sessions", "show", "no-such-session", env=env)
    assert missing.returncode == 1
    assert (
        missing.stderr.strip()
        == "dex-ha sessions show: refused (404 not_found): no session 'no-such-session' in namespace 'default'"
    )
    bad_json = cli("sessions", "answer", "s", "q", "{", "--json-value", env=env)
    assert bad_json.returncode == 2 and "ANSWER: not valid JSON" in bad_json.stderr
    no_token = cli("sessions", "list", env={"DEX_HA_URLS": env["DEX_HA_URLS"]})
    assert no_token.returncode == 1 and "401 unauthorized: set DEX_HA_TOKEN or pass --token" in no_token.stderr


# ---------------------------------------------------------------- the quick start, with and without tokens


def run_quickstart(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python examples/quickstart.py` with no argument: the URLs and tokens come from `env`."""
    return subprocess.run(
        [sys.executable, str(QUICKSTART)],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(**env),
        stdin=subprocess.DEVNULL,
    )


def assert_quickstart_answered(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stdout + done.stderr
    assert any("approval_requested" in line for line in done.stdout.splitlines())
    assert done.stdout.splitlines()[-1] == "answer: Done: order A17 is refunded."


def test_quickstart_runs_on_the_cluster_after_sourcing_tokens_env(cluster: LocalCluster) -> None:
    assert_quickstart_answered(run_quickstart(tokens_env_vars(cluster.dir)))


async def test_quickstart_runs_on_dex_ha_dev_without_tokens(tmp_path: Path) -> None:
    server = DevProcess(tmp_path / "data", tmp_path / "dev.log", relaxed=True)
    server.start()
    try:
        await server.wait_ready()
        done = await asyncio.to_thread(run_quickstart, {"DEX_HA_URLS": server.url})
    finally:
        server.stop()
    assert_quickstart_answered(done)
