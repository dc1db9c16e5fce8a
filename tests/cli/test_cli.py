"""`dex-ha dev`, `dex-ha node`, usage errors, unreachable nodes, the demo, and the pure pieces
behind `cluster up` and `status` (real processes on loopback, free ports, deadlines)."""

from __future__ import annotations

import json
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dex_ha.cli.demo import WORKER_READY
from dex_ha.cli.remote import NodeAnswer
from dex_ha.cli.status import format_status, status_rows
from dex_ha.local_cluster import (
    ClusterError,
    check_ports_free,
    node_process_alive,
    plan_cluster,
    write_cluster_files,
)
from dex_ha.server.config import load_config
from harness.cluster_process import port_args
from tests.cli import (
    clean_env,
    free_port_range,
    free_ports,
    http_status,
    pid_gone,
    run_cli,
    start_cli,
    stop,
    wait_until,
)

# ---------------------------------------------------------------- dev and node


def test_dev_prints_its_url_becomes_ready_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    log = tmp_path / "dev.log"
    proc = start_cli("dev", "--data-dir", str(tmp_path / "data"), "--port", str(port), "--relaxed", log=log)
    try:
        url_line = wait_until(
            lambda: next((line for line in log.read_text().splitlines() if "serving http://" in line), None),
            30,
            "the dev URL line",
        )
        assert f"serving http://127.0.0.1:{port} " in url_line  # the URL alone, as scripts read it
        assert f"console http://127.0.0.1:{port}/ui;" in url_line
        assert "NO authentication" in url_line  # dev mode without tokens says so
        # Printed once the node is ready: what it points to works as soon as it appears.
        assert http_status(f"http://127.0.0.1:{port}/readyz") == 200
        assert http_status(f"http://127.0.0.1:{port}/ui") == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        stop(proc)


def test_log_json_writes_one_json_object_per_log_line(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    log = tmp_path / "dev.log"
    proc = start_cli(
        "dev", "--data-dir", str(tmp_path / "data"), "--port", str(port), "--relaxed", "--log-json", log=log
    )
    try:
        # The URL line comes once the node is ready (a few ms after /readyz says so).
        wait_until(lambda: "serving http://" in log.read_text(), 30, "the dev URL line")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        stop(proc)
    records = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert {"time", "level", "logger", "message"} <= set(records[0])
    messages = [r["message"] for r in records]
    assert any("takeover of term" in m for m in messages) and any("stopped" in m for m in messages)
    # Every log line is JSON; the one plain line is the URL that `dex-ha dev` prints for people.
    plain = [line for line in log.read_text().splitlines() if line and not line.startswith("{")]
    assert len(plain) == 1 and "serving http://" in plain[0]


def _single_node_toml(tmp_path: Path, http_port: int, raft_port: int, extra: str = "") -> Path:
    path = tmp_path / "node.toml"
    path.write_text(f'''node_id = "n1"
data_dir = "{tmp_path / "n1"}"
http_listen = "127.0.0.1:{http_port}"
raft_listen = "127.0.0.1:{raft_port}"
durability = "relaxed"
{extra}
[[peers]]
id = "n1"
raft_addr = "127.0.0.1:{raft_port}"
url = "http://127.0.0.1:{http_port}"
''')
    return path


def test_node_without_tokens_or_secret_refuses_to_start_naming_what_is_missing(tmp_path: Path) -> None:
    http_port, raft_port = free_ports(2)
    config = _single_node_toml(tmp_path, http_port, raft_port)
    result = run_cli("node", "--config", str(config), timeout=30)
    assert result.returncode == 2
    assert "tokens" in result.stderr and "--insecure" in result.stderr
    assert "Traceback" not in result.stderr

    tokens = (
        '[tokens]\nclient = ["client-token-0123456789"]\nworker = ["worker-token-0123456789"]\n'
        'admin = ["admin-token-01234567890"]\n'
    )
    config = _single_node_toml(tmp_path, http_port, raft_port, extra=tokens)
    result = run_cli("node", "--config", str(config), timeout=30)
    assert result.returncode == 2
    assert "cluster_secret" in result.stderr
    assert http_status(f"http://127.0.0.1:{http_port}/livez") is None  # it never served


def test_dev_on_a_port_in_use_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("dev", "--port", str(port), "--data-dir", str(tmp_path / "data"), timeout=30)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr, result.stderr
    # One line, worded as `cluster up` words it: which port, what is wrong, which option moves it.
    assert result.stderr.splitlines() == [
        f"dex-ha dev: port {port} (HTTP on 127.0.0.1) is taken (Address already in use); "
        "choose another port with --port"
    ]
    assert result.stdout == ""


def test_node_with_insecure_starts_and_says_so_in_its_log_and_cluster_view(tmp_path: Path) -> None:
    http_port, raft_port = free_ports(2)
    config = _single_node_toml(tmp_path, http_port, raft_port)
    log = tmp_path / "node.log"
    proc = start_cli("node", "--config", str(config), "--insecure", log=log)
    try:
        url = f"http://127.0.0.1:{http_port}"
        wait_until(lambda: http_status(url + "/readyz") == 200, 30, "/readyz 200")
        result = run_cli("status", "--url", url, "--json", timeout=30)
        assert result.returncode == 0, result.stderr
        answer = json.loads(result.stdout)["nodes"][0]["answer"]
        assert answer["insecure"] is True and answer["role"] == "active"
        assert "INSECURE" in log.read_text()
        assert "WITHOUT authentication" in run_cli("status", "--url", url, timeout=30).stdout
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        stop(proc)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["step-down"],
        ["members", "promote", "n2"],
    ],
)
def test_no_node_reachable_exits_3_with_one_line(args: list[str]) -> None:
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    result = run_cli(*args, "--url", dead, timeout=60)
    assert result.returncode == 3, result.stderr
    assert dead in result.stderr
    assert "Traceback" not in result.stderr
    assert len([line for line in result.stderr.splitlines() if line.startswith("dex-ha")]) == 1


@pytest.mark.parametrize(
    "args",
    [
        ["status", "--url", "not-a-url"],
        ["cluster", "up", "--nodes", "0"],
        ["step-down", "--drain-timeout-ms", "-5"],
        ["members", "add", "--id", "n4"],  # --raft-addr and --node-url missing
        ["cluster"],  # up or down missing
    ],
)
def test_bad_usage_exits_2(args: list[str]) -> None:
    result = run_cli(*args, timeout=30)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr


def test_cluster_up_names_the_port_that_is_taken(tmp_path: Path) -> None:
    base = free_port_range(9)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base + 4))  # the Raft port of n2
        busy.listen()
        result = run_cli(
            "cluster",
            "up",
            "--dir",
            str(tmp_path / "c"),
            *port_args(base),
            timeout=30,
        )
    assert result.returncode == 1
    assert f"port {base + 4} (Raft of n2) is taken" in result.stderr
    assert not (tmp_path / "c" / "pids").exists()  # nothing was started


# ---------------------------------------------------------------- cluster plan and files (no processes)


def test_cluster_files_load_as_node_configs_and_keep_secrets_private(tmp_path: Path) -> None:
    ports = free_ports(9)
    plan = plan_cluster(tmp_path / "c", ports[:3], ports[3:6], ports[6:], durability="relaxed")
    write_cluster_files(plan)
    for node in plan.nodes:
        config = load_config(node.config_path, env={})
        assert config.node_id == node.node_id
        assert config.http_listen == ("127.0.0.1", node.http_port)
        assert config.raft_listen == ("127.0.0.1", node.raft_port)
        assert config.probe_listen == ("127.0.0.1", node.probe_port)
        assert [(p.id, p.raft_addr, p.url) for p in config.peers] == [
            (n.node_id, ("127.0.0.1", n.raft_port), n.url) for n in plan.nodes
        ]
        assert config.cluster_secret == plan.cluster_secret and config.durability == "relaxed"
        assert config.tokens == {role: (token,) for role, token in plan.tokens.items()}
        assert stat.S_IMODE(node.config_path.stat().st_mode) == 0o600
    tokens_env = plan.cluster_dir / "tokens.env"
    assert stat.S_IMODE(tokens_env.stat().st_mode) == 0o600
    assert f"DEX_HA_TOKEN={plan.tokens['admin']}" in tokens_env.read_text()
    assert len(set(plan.tokens.values())) == 3  # one distinct token per role


def test_a_second_plan_for_the_same_dir_keeps_its_secrets_and_refuses_another_layout(tmp_path: Path) -> None:
    ports = free_ports(9)
    first = plan_cluster(tmp_path, ports[:3], ports[3:6], ports[6:])
    write_cluster_files(first)
    again = plan_cluster(tmp_path, ports[:3], ports[3:6], ports[6:])
    assert again.cluster_secret == first.cluster_secret and dict(again.tokens) == dict(first.tokens)
    with pytest.raises(ClusterError, match="holds another cluster"):
        plan_cluster(tmp_path, ports[:2], ports[3:5], ports[6:8])


def test_check_ports_free_accepts_free_ports_and_names_a_listening_one(tmp_path: Path) -> None:
    ports = free_ports(6)
    plan = plan_cluster(tmp_path, ports[:2], ports[2:4], ports[4:])
    check_ports_free(plan)  # all free: no error
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", ports[1]))
        busy.listen()
        with pytest.raises(ClusterError, match=f"port {ports[1]} \\(HTTP of n2\\)"):
            check_ports_free(plan)


def test_node_process_alive_knows_a_node_by_its_command_line_and_not_a_zombie(tmp_path: Path) -> None:
    config = tmp_path / "n1.toml"
    # A stand-in whose command line reads like a node's (`python -c … dex_ha.cli node --config n1.toml`).
    lookalike = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "dex_ha.cli", "node", "--config", str(config)]
    )
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert node_process_alive(lookalike.pid, config)
        assert not node_process_alive(lookalike.pid, tmp_path / "n2.toml")  # another node's config
        assert not node_process_alive(other.pid)  # alive, but no dex-ha node: never to be signalled
        lookalike.kill()
        # Dead but not reaped yet (a zombie, as orphaned nodes are until init reaps them): not running.
        wait_until(lambda: not node_process_alive(lookalike.pid, config), 10, "the zombie counted as gone")
        assert not pid_gone(lookalike.pid)  # the zombie is still there: the check above did not rely on reaping
    finally:
        for proc in (lookalike, other):
            proc.kill()
            proc.wait(timeout=10)


# ---------------------------------------------------------------- the status table


def _view(node_id: str, role: str, leader: str | None, members: list[dict] | None = None) -> dict:
    return {
        "node_id": node_id,
        "role": role,
        "term": 7,
        "leader_id": leader,
        "commit_index": 40,
        "applied_index": 39,
        "lease_remaining_ms": 300 if role == "active" else 0,
        "insecure": False,
        "members": members or [],
    }


def test_status_table_marks_the_silent_node_and_names_the_active_one() -> None:
    members = [
        {"id": n, "voter": True, "url": f"http://h{n[-1]}:8801", "match_index": 40 - i, "last_contact_ms_ago": 10 * i}
        for i, n in enumerate(["n1", "n2", "n3"])
    ]
    answers = [
        NodeAnswer("http://h1:8801", view=_view("n1", "active", "n1", members)),
        NodeAnswer("http://h2:8801", view=_view("n2", "standby", "n1", members)),
        NodeAnswer("http://h3:8801", error="no answer"),
    ]
    rows = status_rows(answers)
    assert [row[0] for row in rows] == ["n1", "n2", "n3"]  # the silent node is named from the member list
    assert rows[2][2] == "NO ANSWER"
    assert rows[1][9] == "39" and rows[1][10] == "10 ms ago"  # match and contact as the active node sees them
    text = format_status(answers)
    assert "active node: n1 (http://h1:8801)" in text
    assert "http://h3:8801: no answer" in text


def test_status_names_a_member_under_the_consistency_alarm() -> None:
    flagged = {**_view("n1", "active", "n1"), "consistency_alarms": {"n2": {"index": 812}}}
    answers = [
        NodeAnswer("http://h1:8801", view=flagged),
        NodeAnswer("http://h2:8801", view=_view("n2", "standby", "n1")),
    ]
    text = format_status(answers)
    assert "CONSISTENCY ALARM: n2's state differed from the majority's at index 812" in text
    assert "CONSISTENCY" not in format_status(answers[1:])


def test_status_shows_each_nodes_version_and_the_cluster_state_machine_during_an_upgrade() -> None:
    """Mid rolling upgrade: n1 (new, active) says its version; n2 runs 0.1.0, whose view
    says none, so its version is the one the active node heard; n3 does not answer."""
    members = [
        {"id": "n1", "voter": True, "url": "http://h1:8801", "version": "0.2.0", "state_machine_version": 2},
        {"id": "n2", "voter": True, "url": "http://h2:8801", "version": "0.1.0", "state_machine_version": 1},
        {"id": "n3", "voter": True, "url": "http://h3:8801", "version": "0.2.0", "state_machine_version": 2},
    ]
    new = {"version": "0.2.0", "state_machine_version": 2, "cluster_state_machine_version": 1}
    answers = [
        NodeAnswer("http://h1:8801", view={**_view("n1", "active", "n1", members), **new}),
        NodeAnswer("http://h2:8801", view=_view("n2", "standby", "n1", members)),
        NodeAnswer("http://h3:8801", error="no answer"),
    ]
    assert [row[-1] for row in status_rows(answers)] == ["0.2.0 (sm v2)", "0.1.0 (sm v1)", "0.2.0 (sm v2)"]
    text = format_status(answers)
    assert "cluster state machine: v1 (it moves to v2 once every member runs it" in text
    members[1] = {**members[1], "version": "0.2.0", "state_machine_version": 2}
    done = [
        NodeAnswer(
            "http://h1:8801", view={**_view("n1", "active", "n1", members), **new, "cluster_state_machine_version": 2}
        )
    ]
    assert "cluster state machine: v2\n" in format_status(done) + "\n"


def test_status_table_warns_when_no_node_is_active() -> None:
    answers = [
        NodeAnswer("http://h1:8801", view=_view("n1", "candidate", None)),
        NodeAnswer("http://h2:8801", error="refused (401 unauthorized): unknown token", refused=True),
    ]
    text = format_status(answers)
    assert "NO active node" in text
    assert status_rows(answers)[1][2] == "REFUSED"


# ---------------------------------------------------------------- the demo


def run_demo_timed(demo_dir: Path, timeout: float) -> tuple[int, list[tuple[float, str]], float, str]:
    """`dex-ha demo --dir DIR`, its stdout read line by line as it comes: (exit code, each line
    with the monotonic time it arrived, the time the process had exited, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dex_ha.cli", "demo", "--dir", str(demo_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=clean_env(),
        text=True,
    )
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
        exited = time.monotonic()
        reader.join(timeout=10)
        assert not reader.is_alive(), "the demo's stdout stayed open after it exited"
        assert proc.stderr is not None
        return code, lines, exited, proc.stderr.read()
    finally:
        stop(proc)


def _stopped_pids(output: str) -> list[int]:
    """The pids the demo says it stopped when it exits."""
    stopped = re.search(r"stopped every process the demo started \(pids ([\d, ]+)\)", output)
    assert stopped is not None, f"the demo did not say which processes it stopped:\n{output}"
    return [int(p) for p in stopped.group(1).split(", ")]


def test_demo_runs_through_a_failover_prints_its_timeline_as_it_happens_and_stops_everything(
    tmp_path: Path,
) -> None:
    demo_dir = tmp_path / "demo"
    code, lines, exited, stderr = run_demo_timed(demo_dir, timeout=120)
    out = "\n".join(line for _, line in lines)
    assert code == 0, out + stderr
    # The timeline streams: its first line arrives while the demo still has seconds of work
    # ahead (reserve_stock alone runs 3 s after the kill), not all at once at the end.
    first_at = next(at for at, line in lines if re.match(r"^\s*\d+\.\d\ds  ", line))
    assert exited - first_at > 2.5, [(round(exited - at, 2), line) for at, line in lines]
    killed_at = next(at for at, line in lines if "killed with SIGKILL" in line)
    assert exited - killed_at > 2.5  # the kill is on screen while reserve_stock runs again
    assert re.search(
        r"^\s*\d+\.\d\ds  \[demo\] node n\d \(the active node, pid \d+\) killed with SIGKILL", out, re.MULTILINE
    )
    assert re.search(r"^\s*\d+\.\d\ds  \[demo\] n\d is the active node \d+ ms after the kill", out, re.MULTILINE)
    assert re.search(r"tool reserve_stock re-run on n\d: attempt 2, same idempotency key", out)
    assert re.search(r"^\s*\d+\.\d\ds  turn completed$", out, re.MULTILINE)
    # Evidence from outside the server: the Worker's tools ran reserve_stock twice with ONE key,
    # and the write (charge_card) once.
    ledger = [json.loads(line) for line in (demo_dir / "ledger.jsonl").read_text().splitlines()]
    reserve = [e for e in ledger if e["tool"] == "reserve_stock" and e["event"] == "started"]
    assert [e["attempt"] for e in reserve] == [1, 2]
    assert len({e["idempotency_key"] for e in reserve}) == 1
    assert len([e for e in ledger if e["tool"] == "charge_card"]) == 1
    # Everything it started is stopped (by pid) when it exits.
    pids = _stopped_pids(out)
    assert len(pids) == 4  # three nodes and the Worker
    wait_until(lambda: all(pid_gone(pid) for pid in pids), 30, "every demo process gone")


def test_demo_refuses_a_dir_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("x")
    result = run_cli("demo", "--dir", str(tmp_path), timeout=30)
    assert result.returncode == 2
    assert "not empty" in result.stderr


def test_demo_interrupted_by_ctrl_c_stops_every_process_it_started(tmp_path: Path) -> None:
    demo_dir = tmp_path / "demo"
    log = tmp_path / "demo.log"
    proc = start_cli("demo", "--dir", str(demo_dir), log=log)
    try:
        # Interrupt once the nodes run and the Worker is up: every kind of child exists.
        wait_until(
            lambda: (
                WORKER_READY in ((demo_dir / "worker.log").read_text() if (demo_dir / "worker.log").exists() else "")
            ),
            60,
            "the demo Worker up",
        )
        node_pids = [int(line.split()[1]) for line in (demo_dir / "pids").read_text().splitlines()]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 1
    finally:
        stop(proc)
    output = log.read_text()
    assert "interrupted; stopping everything" in output and "Traceback" not in output
    pids = set(_stopped_pids(output))
    assert set(node_pids) < pids and len(pids) == 4  # the nodes and the Worker
    wait_until(lambda: all(pid_gone(pid) for pid in pids), 30, "every demo process gone")


def test_dev_with_tokens_from_the_environment_requires_them(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    log = tmp_path / "dev.log"
    token = "client-token-0123456789"
    proc = start_cli(
        "dev",
        "--data-dir",
        str(tmp_path / "data"),
        "--port",
        str(port),
        "--relaxed",
        log=log,
        env=clean_env(
            DEX_HA_TOKENS_CLIENT=token,
            DEX_HA_TOKENS_WORKER="worker-token-0123456789",
            DEX_HA_TOKENS_ADMIN="admin-token-0123456789",
        ),
    )
    try:
        url = f"http://127.0.0.1:{port}"
        # The URL line comes once the node is ready (a few ms after /readyz says so).
        url_line = wait_until(
            lambda: next((line for line in log.read_text().splitlines() if "serving http://" in line), None),
            30,
            "the dev URL line",
        )
        assert "token auth ON" in url_line
        assert http_status(url + "/v1/sessions") == 401
        assert http_status(url + "/v1/sessions", token=token) == 200
    finally:
        stop(proc)


def test_dev_refuses_a_short_token_naming_its_role(tmp_path: Path) -> None:
    done = run_cli(
        "dev", "--data-dir", str(tmp_path / "data"), "--port", "0", env=clean_env(DEX_HA_TOKENS_CLIENT="short")
    )
    assert done.returncode == 2 and "client" in done.stderr and "Traceback" not in done.stderr


def test_dev_refuses_a_bound_of_zero_requests_naming_the_setting(tmp_path: Path) -> None:
    done = run_cli(
        "dev", "--data-dir", str(tmp_path / "data"), "--port", "0", env=clean_env(DEX_HA_MAX_INFLIGHT_REQUESTS="0")
    )
    assert done.returncode == 2 and "max_inflight_requests" in done.stderr and "Traceback" not in done.stderr
