"""OpenTelemetry traces of turns, end to end: a real `dex-ha dev` exports over OTLP/HTTP to a
local receiver (harness/otlp_receiver.py) that decodes the protobuf with
opentelemetry-proto, and the test checks the tree of one turn: the turn span, a span per
step under it, a span per attempt under its step, with their attributes; and a tool's own
span, exported by the Worker's process, under its attempt's span (the task's traceparent)."""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed (pip install -e '.[otel]')")
pytest.importorskip("opentelemetry.proto", reason="opentelemetry-proto is not installed")

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Tracer

from dex_ha.client import DexClient
from dex_ha.server.tracing import trace_id
from dex_ha.worker import Agent, ModelRequest, ScriptedModel, ToolContext, Worker
from harness.cluster_process import LocalCluster
from harness.dev_process import DevProcess
from harness.otlp_receiver import OtlpReceiver, ReceivedSpan
from harness.waiting import eventually
from tests.e2e.conftest import running
from tests.support import failover_agent

AGENT = "traced"
DEADLINE_S = 30.0
STATUS_OK, STATUS_ERROR = 1, 2


def otel_env(receiver: OtlpReceiver) -> dict[str, str]:
    """The standard variables: where to export, and a short batch delay (the default is 5 s)."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}


@pytest.fixture
async def receiver() -> AsyncIterator[OtlpReceiver]:
    otlp = OtlpReceiver()
    await otlp.start()
    try:
        yield otlp
    finally:
        await otlp.stop()


@pytest.fixture
def worker_tracing(receiver: OtlpReceiver) -> Iterator[tuple[TracerProvider, Tracer]]:
    """The tools' own tracer, as an application would set one up: an SDK provider that
    exports to the same receiver (from a thread of its own, not this test's loop)."""
    provider = TracerProvider(resource=Resource.create({"service.name": "test-worker"}))
    exporter = OTLPSpanExporter(endpoint=receiver.url + "/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=100))
    try:
        yield provider, provider.get_tracer("test-tools")
    finally:
        provider.shutdown()


def flaky_model_agent(model_calls: collections.Counter[str], tracer: Tracer) -> Agent:
    """The model fails its first call of each turn (the attempt is retried), then calls
    `lookup` once, then answers. `lookup` starts a span of its own."""

    def script(request: ModelRequest) -> dict[str, Any]:
        last = request.history[-1]
        model_calls[last["type"]] += 1
        if last["type"] == "user" and model_calls["user"] == 1:
            raise RuntimeError("the model API is overloaded")
        if last["type"] == "user":
            return {"content": "", "tool_calls": [{"id": "c-look", "name": "lookup", "arguments": {"q": "7"}}]}
        return {"content": "found it", "tool_calls": []}

    agent = Agent(AGENT, model=ScriptedModel(script))

    @agent.tool(effect="read")
    async def lookup(ctx: ToolContext, q: str) -> dict[str, str]:
        with tracer.start_as_current_span("query the backend"):  # in the context the SDK continued
            return {"found": q}

    return agent


def turn_trace(receiver: OtlpReceiver, session_id: str) -> tuple[ReceivedSpan, list[ReceivedSpan]] | None:
    """The turn span of the session's (only) turn and every span of its trace, once the
    turn span arrived."""
    turns = [s for s in receiver.spans if s.name == "turn" and s.attributes.get("dex.session_id") == session_id]
    if not turns:
        return None
    assert len(turns) == 1, turns
    return turns[0], receiver.trace(turns[0].trace_id)


def json_log_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    return sorted((s for s in spans if s.parent_id == parent.span_id), key=lambda s: s.start_ns)


@pytest.mark.parametrize("transport", ["channel", "http"])
async def test_a_turn_with_a_retried_model_call_and_a_tool_call_is_one_trace(
    tmp_path: Path, receiver: OtlpReceiver, worker_tracing: tuple[TracerProvider, Tracer], transport: str
) -> None:
    """The tree of the turn's spans; the tool's own span under its attempt (the task's
    traceparent, on either transport); the JSON log line of the failed attempt."""
    provider, tracer = worker_tracing
    dev = DevProcess(tmp_path / "data", tmp_path / "dev.log", extra_env=otel_env(receiver), log_json=True)
    dev.start()
    try:
        await dev.wait_ready()
        model_calls: collections.Counter[str] = collections.Counter()
        worker = Worker(
            dev.url,
            agents=[flaky_model_agent(model_calls, tracer)],
            poll_wait_ms=2_000,
            worker_id="w-traced",
            transport=transport,
        )
        async with running(worker), DexClient(dev.url) as client:
            session = await client.create_session(AGENT)
            sid = session.session_id
            await client.send_message(sid, "look it up")
            final = await client.wait_until_idle(sid, timeout_s=DEADLINE_S)
        assert final.history[-1]["type"] == "assistant" and model_calls["user"] == 2
        # Every span of the turn is exported when it ends: the turn span last.
        turn, spans = await eventually(lambda: turn_trace(receiver, sid), "the turn's span", DEADLINE_S)
        await asyncio.to_thread(provider.force_flush)
        await eventually(lambda: len(receiver.trace(turn.trace_id)) >= 9, "the nine spans of the turn", DEADLINE_S)
        spans = receiver.trace(turn.trace_id)
    finally:
        assert dev.stop() == 0, dev.log_tail()

    assert not receiver.bad_requests
    turn_id = turn.attributes["dex.turn_id"]
    assert turn.trace_id == f"{trace_id(sid, turn_id):032x}"  # the id the Worker's task carries too
    assert turn.parent_id == "" and turn.status == STATUS_OK
    assert turn.attributes["dex.status"] == "completed"
    assert turn.resource["service.name"] == "dex-ha"
    # The turn: RunModel (two attempts) -> CallTool (one) -> RunModel (one); nothing else.
    steps = children(spans, turn)
    assert [s.name for s in steps] == ["RunModel", "CallTool", "RunModel"], [s.name for s in spans]
    assert len(spans) == 1 + 3 + 4 + 1, [(s.name, s.parent_id) for s in spans]
    first_model, tool, answer = steps
    assert all(s.status == STATUS_OK and s.attributes["dex.turn_id"] == turn_id for s in steps)
    assert tool.attributes["dex.call_id"] == "c-look" and tool.attributes["dex.outcome"] == "succeeded"

    failed, retried = children(spans, first_model)
    for number, attempt in enumerate((failed, retried), start=1):
        assert attempt.name == f"RunModel attempt {number}"
        assert attempt.attributes["dex.attempt"] == number
        assert attempt.attributes["dex.step_id"] == first_model.attributes["dex.step_id"]
        assert attempt.attributes["dex.worker_id"] == "w-traced"
        assert attempt.attributes["dex.node"] == "dev"
        assert attempt.attributes["dex.term"] >= 1
    assert failed.attributes["dex.outcome"] == "failed" and failed.status == STATUS_ERROR
    assert failed.attributes["dex.attempt_progress"] == "NOT_COMPLETED"
    assert retried.attributes["dex.outcome"] == "completed" and retried.status == STATUS_OK
    (tool_attempt,) = children(spans, tool)
    assert tool_attempt.attributes["dex.outcome"] == "completed"
    # The tool's own span, from the Worker's process, under the attempt that ran it.
    (own,) = children(spans, tool_attempt)
    assert own.name == "query the backend" and own.resource["service.name"] == "test-worker"
    assert [a.attributes["dex.attempt"] for a in children(spans, answer)] == [1]

    # --log-json: the line about the failed attempt names it, and the trace it is in.
    (line,) = [e for e in json_log_lines(dev.log_path) if "failed on worker w-traced" in e["message"]]
    assert {k: line.get(k) for k in ("session_id", "turn_id", "step_id", "attempt", "trace_id")} == {
        "session_id": sid,
        "turn_id": turn_id,
        "step_id": first_model.attributes["dex.step_id"],
        "attempt": 1,
        "trace_id": turn.trace_id,
    }
    assert "the model API is overloaded" in line["message"]


async def test_a_failover_shows_in_the_turns_trace_as_a_takeover_and_a_retried_attempt(
    tmp_path: Path, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in otel_env(receiver).items():  # `cluster up` passes its environment to the nodes
        monkeypatch.setenv(name, value)
    cluster = LocalCluster(tmp_path / "cluster")
    ledger = failover_agent.Ledger()
    try:
        cluster.up()
        urls = list(cluster.urls.values())
        worker = Worker(
            urls,
            token=cluster.tokens["worker"],
            agents=[failover_agent.make_agent(ledger)],
            poll_wait_ms=2_000,
            heartbeat_interval_s=0.2,
            worker_id="w-failover",
        )
        async with running(worker), DexClient(urls, token=cluster.tokens["client"]) as client:
            sid = (await client.create_session(failover_agent.AGENT)).session_id
            await client.send_message(sid, "failover")
            await asyncio.wait_for(ledger.first_attempt_running.wait(), DEADLINE_S)
            old = await cluster.active_node()
            # The model step ended on the old node: its span is exported before the crash.
            await eventually(
                lambda: any(s.attributes.get("dex.session_id") == sid and s.name == "RunModel" for s in receiver.spans),
                "the first model step's span from the old active node",
                DEADLINE_S,
            )
            cluster.kill(old)
            new = await cluster.active_node(not_=old)
            final = await client.wait_until_idle(sid, timeout_s=DEADLINE_S)
            assert final.turns[-1].status == "completed"
            turn, _ = await eventually(lambda: turn_trace(receiver, sid), "the turn's span", DEADLINE_S)
            await eventually(lambda: len(receiver.trace(turn.trace_id)) >= 8, "the eight spans of the turn", DEADLINE_S)
    finally:
        cluster.down()

    spans = receiver.trace(turn.trace_id)
    assert len(spans) == 1 + 3 + 4, [(s.name, s.resource.get("service.instance.id")) for s in spans]
    # The new active node ended the turn, and says where it carried it on from.
    assert turn.resource["service.instance.id"] == new and turn.status == STATUS_OK
    failovers = [attributes for name, attributes in turn.events if name == "failover"]
    assert [f["dex.node"] for f in failovers] == [new]
    first_model, tool, answer = children(spans, turn)
    assert (first_model.name, tool.name, answer.name) == ("RunModel", "CallTool", "RunModel")
    assert first_model.resource["service.instance.id"] == old  # ended before the crash
    assert tool.resource["service.instance.id"] == new and tool.attributes["dex.outcome"] == "succeeded"
    lost, retried = children(spans, tool)
    assert lost.attributes["dex.attempt"] == 1 and lost.attributes["dex.outcome"] == "failed"
    assert lost.status == STATUS_ERROR and lost.attributes["dex.attempt_progress"] == "NOT_COMPLETED"
    assert [name for name, _ in lost.events] == ["takeover"]
    assert lost.events[0][1]["dex.node"] == new
    assert retried.attributes["dex.attempt"] == 2 and retried.attributes["dex.outcome"] == "completed"
    assert retried.attributes["dex.node"] == new and retried.attributes["dex.worker_id"] == "w-failover"
    assert retried.attributes["dex.term"] > lost.attributes["dex.term"]
    assert lost.events[0][1]["dex.term"] == retried.attributes["dex.term"]
