"""Schemathesis against the node's own /openapi.json: for every operation, generated
requests (valid ones and invalid ones) never get a 5xx, and every answer has a status
and a body that the document declares.

The node runs in the test's event loop; Schemathesis is synchronous (requests), so it
runs in a worker thread. A fixed seed and a bounded number of examples per operation keep
the run reproducible and under two minutes on a small machine (about 35 s on two cores).

No operation is left out. On a single node the cluster routes are safe to fuzz: a step
down finds no other voter and answers 409 before it drains anything; an added member is a
learner (it never counts towards a quorum, so the node stays active) whose Raft address is
a loopback port nobody listens on; promoting it is 409 (not caught up) and removing it 200.
Two things are adjusted in generated requests, see `_adjust`: a poll's wait, and a new
member's address.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")

import requests  # noqa: E402 - a dependency of schemathesis
from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core import NotSet  # noqa: E402

from dex_ha.server.api_spec import ROUTES_BY_NAME  # noqa: E402
from tests.server.node_fixture import ADMIN_TOKEN, base_url, free_ports, single_node_config  # noqa: E402

SEED = 20_260_601
EXAMPLES_PER_OPERATION_AND_MODE = 20
RUN_DEADLINE_S = 120.0
REQUEST_TIMEOUT_S = 10.0
CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance]
# Admin may call every route, so every generated request reaches its handler.
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

# A long poll may wait up to 60 s; a test of the poll's input needs no wait at all.
MAX_POLL_WAIT_MS = 50


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)
    requests: int = 0


def _adjust(case: Any, closed_port: int) -> None:
    """Keep generated requests from doing what a test must not: wait long, or make the
    node contact hosts on the network. A POST without a body (promote) says it is JSON, as
    every client must (the node answers 415 otherwise), so that it reaches its handler."""
    if case.operation.method.upper() in ("POST", "PUT") and isinstance(case.body, NotSet):
        case.headers = {**(case.headers or {}), "Content-Type": "application/json"}
    body = case.body if isinstance(case.body, dict) else None
    if body is None:
        return
    if case.operation.label == "POST /v1/worker/poll" and isinstance(body.get("wait_ms", 0), int):
        body["wait_ms"] = min(body.get("wait_ms", MAX_POLL_WAIT_MS), MAX_POLL_WAIT_MS)  # the default is 20 s
    if case.operation.label == "POST /v1/cluster/members" and isinstance(body.get("raft_addr"), str):
        # A learner's address is dialled by the Raft transport: a loopback port nobody listens on.
        body["raft_addr"] = f"127.0.0.1:{closed_port}"


def _check_event_stream(case: Any, url: str) -> None:
    """GET /v1/sessions/{id}/events: a 200 is an endless stream, so only its head is read."""
    kwargs = case.as_transport_kwargs(base_url=url, headers=AUTH)
    kwargs.pop("session", None)
    with requests.request(**kwargs, stream=True, timeout=REQUEST_TIMEOUT_S) as response:
        if response.status_code == 200:
            assert response.headers["Content-Type"].startswith("text/event-stream"), response.headers
            return
        response.content  # noqa: B018 - an error answer is short: read it whole
    case.validate_response(response, checks=CHECKS, headers=AUTH)


def _run_operation(operation: Any, url: str, mode: GenerationMode, closed_port: int, findings: Findings) -> None:
    @hypothesis.seed(SEED)
    @settings(
        max_examples=EXAMPLES_PER_OPERATION_AND_MODE,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        findings.requests += 1
        _adjust(case, closed_port)
        if operation.label == "GET /v1/sessions/{session_id}/events":
            _check_event_stream(case, url)
        else:
            case.call_and_validate(base_url=url, headers=AUTH, checks=CHECKS, timeout=REQUEST_TIMEOUT_S)

    try:
        run()
    except hypothesis.errors.Unsatisfiable:  # nothing to make invalid (no parameters, no body)
        assert mode is GenerationMode.NEGATIVE, operation.label
    except Exception as exc:  # a check failed: note it and go on with the other operations
        findings.problems.append(f"{operation.label} ({mode.value}): {exc}")


def run_schemathesis(url: str, closed_port: int) -> Findings:
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", timeout=REQUEST_TIMEOUT_S)
    findings = Findings()
    operations = [result.ok() for result in schema.get_all_operations()]
    # Schemathesis leaves out the operation that serves the schema it loaded (GET /openapi.json).
    assert len(operations) == len(ROUTES_BY_NAME) - 1, [op.label for op in operations]
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _run_operation(operation, url, mode, closed_port, findings)
    return findings


@pytest.fixture
def id_format() -> Any:
    """The "id" format's values for generation: printable text (what str.isprintable() accepts:
    letters, marks, numbers, punctuation, symbols, the space). The document's pattern for
    ids only rules out control characters (no portable regex spells "printable"), so from
    the pattern alone most generated ids would be refused and the handlers barely reached."""
    from schemathesis.specs.openapi.formats import unregister_string_format

    printable = st.characters(categories=["L", "M", "N", "P", "S"]) | st.just(" ")
    schemathesis.openapi.format("id", st.text(printable, min_size=1, max_size=200))
    yield
    unregister_string_format("id")


async def test_schemathesis_finds_no_server_error_and_no_schema_mismatch(nodes, tmp_path: Path, id_format):
    node = await nodes(single_node_config(tmp_path / "node"))
    started = time.monotonic()
    async with asyncio.timeout(RUN_DEADLINE_S):
        findings = await asyncio.to_thread(run_schemathesis, base_url(node), free_ports(1)[0])
    took = time.monotonic() - started
    print(f"schemathesis: {findings.requests} requests in {took:.1f} s")
    assert not findings.problems, "\n\n".join(findings.problems)
    assert findings.requests >= len(ROUTES_BY_NAME) * 2 * 5  # it really ran
