"""A local cluster on loopback: its plan, its files, its node processes and the waits.

`dex-ha cluster up | down` (dex_ha/cli/cluster.py), `dex-ha demo` and the test and bench
harness (harness/) all run a cluster of real `dex-ha node` processes on one machine with
these pieces:

- the plan: `plan_cluster` gives a `ClusterPlan` (the nodes, their HTTP, Raft and probe
  ports, durability, a generated cluster secret and one token per role), kept when the
  directory already holds the same cluster;
- the files: `write_cluster_files` writes one TOML per node (`node_toml`), the layout and
  the tokens;
- the ports: `free_ports` / `free_port_range` choose free loopback ports outside the
  kernel's ephemeral range; `port_in_use` says why a port cannot be listened on;
- the processes: `start_node` runs `python -m dex_ha.cli node --config …` in a session of
  its own; the pids go to a file (`write_pids` / `read_pids`); `stop_processes` and
  `cluster_down` stop them by pid;
- the waits: `wait_for_one_active` until exactly one node answers /readyz 200, each with a
  deadline.

What a cluster directory holds:

    cluster.json   the layout, the cluster secret and the tokens (mode 0600); a second `up`
                   with the same options restarts the same cluster on its data
    n1.toml …      one config per node (mode 0600: it holds the secret and the tokens)
    n1/ …          the data directories
    n1.log …       each node's stdout and stderr
    tokens.env     the tokens, as shell exports for the user (mode 0600)
    pids           "n1 12345" per line: the processes that `cluster down` stops
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dex_ha.client import Connection, DexError
from dex_ha.server.auth import ROLES
from dex_ha.server.config import (
    ENV_KEYS as CONFIG_ENV_KEYS,  # the node's env overrides
)

HOST = "127.0.0.1"
LAYOUT_FILE = "cluster.json"
PIDS_FILE = "pids"
TOKENS_FILE = "tokens.env"
# How often readiness and process exits are checked while waiting.
POLL_INTERVAL_S = 0.05
LOG_TAIL_LINES = 15


class ClusterError(Exception):
    """A cluster command cannot go on; the message says why and what to do."""


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True)
class NodePlan:
    """One node of a local cluster: its id, ports and files under the cluster directory."""

    node_id: str
    http_port: int
    raft_port: int
    cluster_dir: Path
    probe_port: int  # /livez and /readyz on their own thread (server/probes.py)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    @property
    def raft_addr(self) -> str:
        return f"{HOST}:{self.raft_port}"

    @property
    def config_path(self) -> Path:
        return self.cluster_dir / f"{self.node_id}.toml"

    @property
    def data_dir(self) -> Path:
        return self.cluster_dir / self.node_id

    @property
    def log_path(self) -> Path:
        return self.cluster_dir / f"{self.node_id}.log"


@dataclass(frozen=True)
class ClusterPlan:
    """Everything `up` needs: the nodes, durability, generated secret and tokens."""

    cluster_dir: Path
    nodes: tuple[NodePlan, ...]
    durability: str
    cluster_secret: str
    tokens: Mapping[str, str]  # role -> the one token of that role
    drain_timeout_ms: int | None = None  # None: the node's default

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    @property
    def node_ids(self) -> list[str]:
        return [node.node_id for node in self.nodes]

    def node(self, node_id: str) -> NodePlan:
        return next(n for n in self.nodes if n.node_id == node_id)

    def layout(self) -> dict[str, object]:
        """What must match for a second `up` to restart the same cluster on its data."""
        return {
            "nodes": [[n.node_id, n.http_port, n.raft_port, n.probe_port] for n in self.nodes],
            "durability": self.durability,
            "drain_timeout_ms": self.drain_timeout_ms,
        }


def contiguous_ports(base: int, count: int, what: str) -> list[int]:
    """`base`, `base + 1`, …: the ports of `count` nodes; ValueError naming `what` when out of range."""
    if not 1 <= base or base + count - 1 > 65535:
        raise ValueError(f"{what}: {base}..{base + count - 1} is not a range of TCP ports (1..65535)")
    return [base + i for i in range(count)]


def plan_cluster(
    cluster_dir: Path,
    http_ports: list[int],
    raft_ports: list[int],
    probe_ports: list[int],
    *,
    durability: str = "strict",
    drain_timeout_ms: int | None = None,
) -> ClusterPlan:
    """The plan of a cluster with one node per HTTP, Raft and probe port (ids n1, n2, …).

    When `cluster_dir` already holds a cluster, its secret and tokens are kept (the nodes
    restart on their data); a different layout there is refused, since the nodes' Raft
    logs remember the old members.
    """
    if not (len(http_ports) == len(raft_ports) == len(probe_ports)) or not http_ports:
        raise ValueError("http_ports, raft_ports and probe_ports: need one of each per node, at least one node")
    if durability not in ("strict", "relaxed"):
        raise ValueError(f"durability must be strict or relaxed, not {durability!r}")
    if len(set(http_ports) | set(raft_ports) | set(probe_ports)) != 3 * len(http_ports):
        raise ValueError("ports: the HTTP, Raft and probe port ranges overlap; choose bases further apart")
    cluster_dir = cluster_dir.resolve()
    nodes = tuple(
        NodePlan(f"n{i + 1}", http, raft, cluster_dir, probe)
        for i, (http, raft, probe) in enumerate(zip(http_ports, raft_ports, probe_ports))
    )
    # Hex, not urlsafe: a token that starts with "-" reads as an option on a command line.
    fresh = ClusterPlan(
        cluster_dir,
        nodes,
        durability,
        secrets.token_hex(32),
        {role: secrets.token_hex(24) for role in ROLES},
        drain_timeout_ms,
    )
    return _reuse_existing(fresh)


def _reuse_existing(fresh: ClusterPlan) -> ClusterPlan:
    path = fresh.cluster_dir / LAYOUT_FILE
    if not path.exists():
        return fresh
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ClusterError(f"{path}: cannot read it ({exc}); remove {fresh.cluster_dir} or use another --dir") from None
    if saved.get("layout") != json.loads(json.dumps(fresh.layout())):
        raise ClusterError(
            f"{fresh.cluster_dir} holds another cluster ({_describe_layout(saved.get('layout'))}); "
            f"start it with the same options, or use another --dir"
        )
    return ClusterPlan(
        fresh.cluster_dir,
        fresh.nodes,
        fresh.durability,
        saved["cluster_secret"],
        dict(saved["tokens"]),
        fresh.drain_timeout_ms,
    )


def _describe_layout(layout: object) -> str:
    if not isinstance(layout, dict):
        return "an unreadable layout"
    nodes = layout.get("nodes") or []
    ports = ", ".join(
        f"{n[0]} http {n[1]} raft {n[2]}" + (f" probes {n[3]}" if len(n) > 3 else "")
        for n in nodes
        if isinstance(n, list) and len(n) >= 3
    )
    return f"{len(nodes)} nodes: {ports}; durability {layout.get('durability')}"


# ---------------------------------------------------------------- files


def node_toml(plan: ClusterPlan, node: NodePlan) -> str:
    """The config of one node (the keys of dex_ha/server/config.py)."""
    q = json.dumps  # a JSON string is a valid TOML basic string
    lines = [
        f"# dex-ha node {node.node_id} of a local {len(plan.nodes)}-node cluster (written by `dex-ha cluster up`).",
        "# Loopback only: for trying HA on one machine; deploy/ has configs for three hosts.",
        f"node_id = {q(node.node_id)}",
        f"data_dir = {q(str(node.data_dir))}",
        f"http_listen = {q(f'{HOST}:{node.http_port}')}",
        f"url = {q(node.url)}",
        f"raft_listen = {q(node.raft_addr)}",
        f"probe_listen = {q(f'{HOST}:{node.probe_port}')}",
        f"durability = {q(plan.durability)}",
        f"cluster_secret = {q(plan.cluster_secret)}",
    ]
    if plan.drain_timeout_ms is not None:
        lines.append(f"drain_timeout_ms = {plan.drain_timeout_ms}")
    lines += ["", "[tokens]"]
    lines += [f"{role} = [{q(token)}]" for role, token in plan.tokens.items()]
    for peer in plan.nodes:
        lines += [
            "",
            "[[peers]]",
            f"id = {q(peer.node_id)}",
            f"raft_addr = {q(peer.raft_addr)}",
            f"url = {q(peer.url)}",
        ]
    return "\n".join(lines) + "\n"


def tokens_env(plan: ClusterPlan) -> str:
    """Shell exports of the tokens; DEX_HA_TOKEN (read by the dex-ha commands) is the admin token."""
    lines = [
        f"# Tokens of the dex-ha cluster in {plan.cluster_dir}. Use: source {plan.cluster_dir / TOKENS_FILE}",
        f"export DEX_HA_TOKEN={plan.tokens['admin']}",
    ]
    lines += [f"export DEX_HA_{role.upper()}_TOKEN={plan.tokens[role]}" for role in ROLES]
    lines.append(f"export DEX_HA_URLS={','.join(plan.urls)}")
    return "\n".join(lines) + "\n"


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (it holds a secret or tokens)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)  # the mode of an existing file is not changed by open()


def write_cluster_files(plan: ClusterPlan) -> None:
    """cluster.json, one TOML per node, tokens.env; the data directories."""
    plan.cluster_dir.mkdir(parents=True, exist_ok=True)
    saved = {"layout": plan.layout(), "cluster_secret": plan.cluster_secret, "tokens": dict(plan.tokens)}
    _write_private(plan.cluster_dir / LAYOUT_FILE, json.dumps(saved, indent=2) + "\n")
    for node in plan.nodes:
        node.data_dir.mkdir(exist_ok=True)
        _write_private(node.config_path, node_toml(plan, node))
    _write_private(plan.cluster_dir / TOKENS_FILE, tokens_env(plan))


# ---------------------------------------------------------------- ports and processes


def port_in_use(host: str, port: int) -> str | None:
    """Why nothing can listen on host:port now (the OS's words), None when it is free.

    Binds as a node's own listeners do: with SO_REUSEADDR, so a port left in TIME_WAIT counts
    as free. A host that does not resolve is not this check's to report (None): the server names it.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError):
        return None
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def port_taken_message(port: int, what: str, reason: str, options: str) -> str:
    """The one line `cluster up` and `dev` print for a port in use: which, why, which option moves it."""
    return f"port {port} ({what}) is taken ({reason}); choose {options}"


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports, chosen outside the kernel's ephemeral range.

    Why outside it: a port the kernel hands out on its own (to an outgoing connection, or
    to a listener bound to port 0) can land on a port chosen here in the moment between
    choosing it and the node binding it, and the node then fails with "address in use".
    Ports below the ephemeral range are only ever taken by someone asking for them by number.
    """
    low, high = _chosen_port_range()
    rng = random.Random()
    chosen: list[int] = []
    for _ in range(200 * count):
        port = rng.randrange(low, high)
        if port not in chosen and _bindable(port):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise ClusterError(f"no {count} free ports found in {low}-{high}")


def free_port_range(count: int, attempts: int = 200) -> int:
    """The first of `count` consecutive free loopback ports (`cluster up` uses base + i),
    outside the kernel's ephemeral range for the reason free_ports gives."""
    low, high = _chosen_port_range()
    rng = random.Random()
    for _ in range(attempts):
        base = rng.randrange(low, high - count)
        if all(_bindable(base + i) for i in range(count)):
            return base
    raise ClusterError(f"no {count} consecutive free ports found")


def _chosen_port_range() -> tuple[int, int]:
    """[low, high) for chosen ports: from 10000 up to the start of the ephemeral range
    (Linux's /proc/sys/net/ipv4/ip_local_port_range), or 20000-30000 where that is unknown."""
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 20_000, 30_000
    if ephemeral_low - 10_000 >= 2_000:
        return 10_000, ephemeral_low
    return 20_000, 30_000  # an unusual ephemeral range: take a fixed band and rely on the bind check


def _bindable(port: int) -> bool:
    return port_in_use(HOST, port) is None


def check_ports_free(plan: ClusterPlan) -> None:
    """ClusterError naming the first port of the plan that something else listens on."""
    for node in plan.nodes:
        for port, what in ((node.http_port, "HTTP"), (node.raft_port, "Raft"), (node.probe_port, "probes")):
            reason = port_in_use(HOST, port)
            if reason is not None:
                raise ClusterError(
                    port_taken_message(
                        port,
                        f"{what} of {node.node_id}",
                        reason,
                        "other ports with --base-port / --raft-base-port / --probe-base-port",
                    )
                )


def node_env() -> dict[str, str]:
    """This environment without the DEX_HA_* config overrides, which would apply to every node alike."""
    overrides = {f"DEX_HA_{key.upper()}" for key in CONFIG_ENV_KEYS}
    overrides |= {f"DEX_HA_TOKENS_{role.upper()}" for role in ROLES}
    return {k: v for k, v in os.environ.items() if k not in overrides}


def start_node(
    node: NodePlan, extra_env: Mapping[str, str] | None = None, extra_args: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    """`python -m dex_ha.cli node --config …` with stdout and stderr to the node's log.

    A new session: the node outlives this command, and a Ctrl-C in its terminal does not reach it.
    `extra_env` is for tests (e.g. DEX_HA_FAILPOINTS for one node); `extra_args` go after the
    config (e.g. `--join` for a new incarnation).
    """
    with open(node.log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "dex_ha.cli", "node", "--config", str(node.config_path), *extra_args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**node_env(), **(extra_env or {})},
            start_new_session=True,
        )


def write_pids(cluster_dir: Path, pids: Mapping[str, int]) -> None:
    (cluster_dir / PIDS_FILE).write_text("".join(f"{node_id} {pid}\n" for node_id, pid in pids.items()))


def read_pids(cluster_dir: Path) -> dict[str, int]:
    """The recorded pids by node id ({} when there is no pids file)."""
    path = cluster_dir / PIDS_FILE
    if not path.exists():
        return {}
    pids: dict[str, int] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            raise ClusterError(f"{path}:{number}: expected 'NODE_ID PID', got {line!r}")
        pids[parts[0]] = int(parts[1])
    return pids


def node_process_alive(pid: int, config_path: Path | None = None) -> bool:
    """Whether `pid` runs (a zombie does not), and — where /proc tells — is the dex-ha node of
    `config_path`, so that a pid reused by another program is never signalled."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # someone else's process: not one of ours
    proc = Path(f"/proc/{pid}")
    if not proc.exists():
        return True  # no /proc (macOS): the pid is all we know
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = (proc / "cmdline").read_bytes().split(b"\0")
    except (OSError, IndexError):
        return False  # it ended while we looked
    if state == "Z":
        return False
    args = [a.decode(errors="replace") for a in cmdline]
    ours = "dex_ha.cli" in args and "node" in args
    return ours and (config_path is None or str(config_path) in args)


# ---------------------------------------------------------------- readiness


async def ready_nodes(probes: Mapping[str, Connection]) -> list[str]:
    """The ids of the nodes whose /readyz answers 200 now (one try each, all at once)."""

    async def is_ready(conn: Connection) -> bool:
        try:
            await conn.request("GET", "/readyz")
            return True
        except DexError:  # 503 not ready, or unreachable (give_up_after_s=0: no retry)
            return False

    answers = await asyncio.gather(*(is_ready(conn) for conn in probes.values()))
    return [node_id for node_id, ready in zip(probes, answers) if ready]


def readiness_probes(nodes: Iterable[NodePlan]) -> dict[str, Connection]:
    """One single-try Connection per node (close them with close_all)."""
    return {n.node_id: Connection(n.url, give_up_after_s=0, request_timeout_s=1.0) for n in nodes}


async def close_all(conns: Iterable[Connection]) -> None:
    await asyncio.gather(*(conn.close() for conn in conns))


async def wait_for_one_active(
    nodes: Iterable[NodePlan], timeout_s: float, exited: Callable[[], str | None] = lambda: None
) -> str:
    """Wait until exactly one node answers /readyz 200 and return its id.

    `exited` names a node process that died (checked on every round): waiting on is then
    pointless, so it raises ClusterError at once instead of at the deadline.
    """
    nodes = list(nodes)
    probes = readiness_probes(nodes)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            ready = await ready_nodes(probes)
            if len(ready) == 1:
                return ready[0]
            dead = exited()
            if dead is not None:
                raise ClusterError(f"node {dead} exited while the cluster started")
            if time.monotonic() > deadline:
                raise ClusterError(f"no single active node within {timeout_s:.0f} s (ready now: {ready or 'none'})")
            await asyncio.sleep(POLL_INTERVAL_S)
    finally:
        await close_all(probes.values())


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    if not path.exists():
        return "(no log)"
    return "\n".join("    " + line for line in path.read_text(errors="replace").splitlines()[-lines:])


# ---------------------------------------------------------------- up


@dataclass(frozen=True)
class UpResult:
    plan: ClusterPlan
    pids: dict[str, int]
    active: str


def live_recorded_nodes(cluster_dir: Path) -> dict[str, int]:
    """The recorded node pids that still run their node of this directory."""
    return {
        node_id: pid
        for node_id, pid in read_pids(cluster_dir).items()
        if node_process_alive(pid, cluster_dir.resolve() / f"{node_id}.toml")
    }


def cluster_up(plan: ClusterPlan, timeout_s: float = 60.0) -> UpResult:
    """Write the files, start every node, wait for exactly one active node.

    On any failure the nodes started here are stopped again (by pid) before ClusterError.
    """
    running = live_recorded_nodes(plan.cluster_dir) if plan.cluster_dir.exists() else {}
    if running:
        listed = ", ".join(f"{node_id} (pid {pid})" for node_id, pid in running.items())
        raise ClusterError(
            f"{plan.cluster_dir} already has running nodes: {listed}; "
            f"stop them with: dex-ha cluster down --dir {plan.cluster_dir}"
        )
    check_ports_free(plan)
    write_cluster_files(plan)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for node in plan.nodes:
            procs[node.node_id] = start_node(node)
        write_pids(plan.cluster_dir, {node_id: p.pid for node_id, p in procs.items()})
        active = asyncio.run(wait_for_one_active(plan.nodes, timeout_s, lambda: _first_exited(procs)))
    except BaseException as exc:  # Ctrl-C too: never leave half a cluster behind
        stop_processes(procs, timeout_s=10.0)
        (plan.cluster_dir / PIDS_FILE).unlink(missing_ok=True)
        if isinstance(exc, ClusterError):
            raise ClusterError(f"{exc}\n{node_log_tails(plan)}") from None
        raise
    return UpResult(plan, {node_id: p.pid for node_id, p in procs.items()}, active)


def _first_exited(procs: Mapping[str, subprocess.Popen[bytes]]) -> str | None:
    return next((node_id for node_id, p in procs.items() if p.poll() is not None), None)


def node_log_tails(plan: ClusterPlan) -> str:
    return "\n".join(f"  {n.log_path} (last lines):\n{log_tail(n.log_path)}" for n in plan.nodes)


# ---------------------------------------------------------------- down


def stop_processes(procs: Mapping[str, subprocess.Popen[bytes]], timeout_s: float) -> None:
    """SIGTERM our own children, wait up to `timeout_s`, SIGKILL the rest, and reap them."""
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for p in procs.values():
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def cluster_down(cluster_dir: Path, timeout_s: float = 45.0) -> list[str]:
    """SIGTERM every recorded node that still runs, wait (deadline), SIGKILL stragglers.

    Returns one line per node saying what happened; removes the pids file at the end.
    """
    cluster_dir = cluster_dir.resolve()
    recorded = read_pids(cluster_dir)
    if not recorded:
        raise ClusterError(f"no pids recorded in {cluster_dir / PIDS_FILE}: nothing to stop")
    configs = {node_id: cluster_dir / f"{node_id}.toml" for node_id in recorded}
    live = {node_id: pid for node_id, pid in recorded.items() if node_process_alive(pid, configs[node_id])}
    report = {node_id: f"{node_id} (pid {pid}): was not running" for node_id, pid in recorded.items()}
    for pid in live.values():
        _signal(pid, signal.SIGTERM)
    left = _wait_until_gone(live, configs, timeout_s)
    for node_id, pid in live.items():
        report[node_id] = f"{node_id} (pid {pid}): stopped"
    for node_id, pid in left.items():
        _signal(pid, signal.SIGKILL)
        report[node_id] = f"{node_id} (pid {pid}): did not stop within {timeout_s:.0f} s; killed (SIGKILL)"
    still = _wait_until_gone(left, configs, 10.0)
    for node_id, pid in still.items():
        report[node_id] = f"{node_id} (pid {pid}): STILL RUNNING after SIGKILL"
    if not still:
        (cluster_dir / PIDS_FILE).unlink(missing_ok=True)
    return [report[node_id] for node_id in recorded]


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass  # it ended on its own meanwhile


def _wait_until_gone(pids: Mapping[str, int], configs: Mapping[str, Path], timeout_s: float) -> dict[str, int]:
    """Poll until none of `pids` runs or the deadline passes; the ones still running."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = {node_id: pid for node_id, pid in pids.items() if node_process_alive(pid, configs[node_id])}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(POLL_INTERVAL_S)


__all__ = [
    "HOST",
    "LAYOUT_FILE",
    "PIDS_FILE",
    "TOKENS_FILE",
    "ClusterError",
    "ClusterPlan",
    "NodePlan",
    "UpResult",
    "check_ports_free",
    "close_all",
    "cluster_down",
    "cluster_up",
    "contiguous_ports",
    "free_port_range",
    "free_ports",
    "live_recorded_nodes",
    "node_env",
    "node_log_tails",
    "node_process_alive",
    "node_toml",
    "plan_cluster",
    "port_in_use",
    "port_taken_message",
    "read_pids",
    "readiness_probes",
    "ready_nodes",
    "start_node",
    "stop_processes",
    "wait_for_one_active",
    "write_cluster_files",
    "write_pids",
]
