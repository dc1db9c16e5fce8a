"""Overload: a burst of clients costs the active node neither its lease nor its place.

2000 concurrent clients (harness/http_load.py: closed loops that do not wait out
Retry-After, one keep-alive connection each, session GETs, session lists, creates and
unauthenticated /metrics) load one node for 10 s:
- a three-node cluster (`dex-ha cluster up`, relaxed durability as in every e2e test),
  loaded on its active node: afterwards every node reports the term of before and the
  same active node (no election happened);
- `dex-ha dev` (strict durability, its default): the one node stays active (same term),
  and never says `not_active`.

In both, every answer is 2xx or 503 `overloaded` with Retry-After (the node sheds what it
cannot serve and stays the active node), every kind of request got some 2xx answers (the
node keeps serving: shedding everything would pass the other checks), and every request
got an HTTP answer.

Transport errors (a request with no HTTP answer) fail the test, whatever their class: a
reset or a close without an answer is the server dropping work it accepted, and a timeout
means a request waited more than 20 s (10 s for the connect). The connect storm of 2000
clients at once is no excuse on a 2-core machine: the nodes listen with an accept queue of
4096 (capped by net.core.somaxconn, 4096 since Linux 5.4), and a SYN the kernel drops anyway
is retransmitted after 1 and 3 s, well within the connect timeout. The load generator
shares the cores with the nodes, which makes answers slower but must not make them fail.

How fast the node answers (answers/s, latency, the followers' heartbeat gap) is measured
by bench/overload_bench.py, not asserted here.
"""

from __future__ import annotations

import resource
import secrets
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path

import pytest

from harness.cluster_process import LocalCluster
from harness.cluster_state import ClusterSnapshot, observe_settled
from harness.dev_process import DevProcess
from harness.http_load import LoadConfig, LoadResult, fds_needed, raise_fd_limit, run_load

CLIENTS = 2000
LOAD_S = 10.0
MIX = {"get_session": 0.40, "list_sessions": 0.15, "create_session": 0.20, "metrics": 0.25}
SETTLE_DEADLINE_S = 20.0  # after the load, until one node is active again (if one is not)
WHAT_IT_MEANS = {  # for the answers a node must not give under load
    "not_active": "the node said it is not the active node: it lost its lease or leadership under load",
    "internal": "the node failed requests (500): its log says why",
}


@pytest.fixture(autouse=True)
def fd_limit() -> Iterator[None]:
    """Raise RLIMIT_NOFILE before the nodes start (autouse fixtures run first): they
    inherit it, and each side of a connection is a file descriptor. Restored afterwards."""
    saved = resource.getrlimit(resource.RLIMIT_NOFILE)
    raise_fd_limit(fds_needed(CLIENTS))  # LoadSetupError names the limit and how to raise it
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, saved)


@pytest.fixture
async def dev(tmp_path: Path) -> AsyncIterator[tuple[DevProcess, str]]:
    """`dex-ha dev` with a client token (auth on, as in a cluster); stopped by pid."""
    token = secrets.token_hex(24)
    process = DevProcess(tmp_path / "dev-data", tmp_path / "dev.log", extra_env={"DEX_HA_TOKENS_CLIENT": token})
    process.start()
    try:
        await process.wait_ready()
        yield process, token
    finally:
        process.stop()


async def test_a_cluster_keeps_its_term_and_active_node_under_2000_clients(cluster: LocalCluster) -> None:
    token = cluster.tokens["client"]
    before = await settled(cluster.urls, token)
    active = before.active[0]

    result = await run_load(LoadConfig(cluster.urls[active], token, clients=CLIENTS, duration_s=LOAD_S, mix=MIX))
    after = await observe_settled(cluster.urls, token, SETTLE_DEADLINE_S)

    problems = election_problems(before, after) + answer_problems(result)
    assert not problems, report(
        f"the active node {active} of a three-node cluster",
        result,
        before,
        after,
        problems,
        logs=f"{cluster.dir}/n*.log",
    )


async def test_dev_stays_active_under_2000_clients(dev: tuple[DevProcess, str]) -> None:
    process, token = dev
    urls = {"dev": process.url}
    before = await settled(urls, token)

    result = await run_load(LoadConfig(process.url, token, clients=CLIENTS, duration_s=LOAD_S, mix=MIX))
    after = await observe_settled(urls, token, SETTLE_DEADLINE_S)

    problems = election_problems(before, after) + answer_problems(result)
    assert not problems, report("dex-ha dev", result, before, after, problems, logs=str(process.log_path))


async def settled(urls: Mapping[str, str], token: str) -> ClusterSnapshot:
    """Every node answers, one is active, all on one term: the state the load starts from."""
    snapshot = await observe_settled(urls, token, SETTLE_DEADLINE_S)
    assert snapshot.settled, f"no settled cluster before the load: {snapshot.describe()}"
    return snapshot


def election_problems(before: ClusterSnapshot, after: ClusterSnapshot) -> list[str]:
    """What says that the active node lost its place: another term, another active node."""
    problems = []
    if any(n.error is not None for n in after.nodes):
        problems.append("a node did not answer /v1/cluster after the load")
    if after.active != before.active:
        problems.append(
            f"the active node changed: {before.active} before the load, {after.active or 'none'} after "
            f"(waited up to {SETTLE_DEADLINE_S:.0f} s for one)"
        )
    terms_after = sorted({n.term for n in after.nodes if n.term is not None})
    if terms_after != [before.max_term]:
        problems.append(
            f"the term moved from {before.max_term} to {terms_after}: an election happened under load "
            f"(the active node lost its lease or leadership)"
        )
    return problems


def answer_problems(result: LoadResult) -> list[str]:
    """What says that the node did not shed load the way docs/api.md says (2xx, or 503
    `overloaded` with Retry-After), or did not really serve."""
    problems = []
    unexpected = {
        answer: n for answer, n in result.by_answer.items() if not answer.startswith("2") and answer != "503 overloaded"
    }
    if unexpected:
        problems.append(f"answers other than 2xx or 503 overloaded: {unexpected}")
        problems += [f"{code}: {meaning}" for code, meaning in WHAT_IT_MEANS.items() if result.count(code)]
    missing = result.unavailable_without_retry_after.get("overloaded", 0)
    if missing:
        problems.append(f"{missing} overloaded answers came without Retry-After")
    if result.transport_errors:
        problems.append(f"requests without an HTTP answer: {result.transport_errors} (e.g. {result.error_examples})")
    starved = sorted(kind for kind in MIX if result.by_kind.get(kind, {}).get("2xx", 0) == 0)
    if starved:
        problems.append(f"no request of kind {starved} was accepted in {LOAD_S:.0f} s: the node did not serve them")
    if result.clients_answered < result.clients:
        problems.append(f"only {result.clients_answered} of {result.clients} clients got any HTTP answer")
    return problems


def report(
    target: str, result: LoadResult, before: ClusterSnapshot, after: ClusterSnapshot, problems: list[str], logs: str
) -> str:
    lines = [
        f"{CLIENTS} clients for {LOAD_S:.0f} s against {target}:",
        *(f"  - {p}" for p in problems),
        f"load: {result.summary()}",
        f"answers by kind: {result.by_kind}",
        f"cluster before: {before.describe()}",
        f"cluster after:  {after.describe()}",
        f"node logs: {logs}",
    ]
    return "\n".join(lines)
