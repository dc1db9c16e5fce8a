"""dex_ha.adapters.turn_segment with a fake framework: a segment runs its own loop inline
and returns the deferred calls it ended on; the agent declares only the deferred tools."""

from __future__ import annotations

from typing import Any

import pytest

from dex_ha.adapters.turn_segment import DeferredTool, SegmentModel, segment_agent
from dex_ha.worker import ToolContext
from dex_ha.worker.model import ModelRequest, ModelResponse, ToolCall
from tests.support.doubles import TextSink


class FakeFramework:
    """A framework loop: it 'runs' an inline tool of its own, then calls a deferred tool,
    then answers once it sees that tool's result. Inline runs are counted."""

    def __init__(self, deferred_name: str = "deploy") -> None:
        self.deferred_name = deferred_name
        self.inline_runs = 0

    async def run(self, request: ModelRequest, stream: Any) -> ModelResponse:
        if any(item["type"] == "tool_result" for item in request.history):
            return ModelResponse("deployed")
        self.inline_runs += 1  # the framework's own tool: inside the segment
        stream.send_text("checking ")
        return ModelResponse("checked", [ToolCall("d1", self.deferred_name, {"service": "web"})])

    async def summarize(self, history: list[dict[str, Any]], summary: str | None) -> str:
        return f"{len(history)} items"


async def deploy(ctx: ToolContext, service: str) -> str:
    return f"deployed {service}"


def request(history: list[dict[str, Any]], agent_tools: list[dict[str, Any]]) -> ModelRequest:
    return ModelRequest(history, None, agent_tools)


async def test_a_segment_agent_declares_its_deferred_tools_and_relays_the_segments_answer() -> None:
    framework = FakeFramework()
    agent = segment_agent("ops", framework, [DeferredTool("deploy", deploy, effect="idempotent_write")])
    tools = agent.definition()["tools"]
    assert [(t["name"], t["effect"]) for t in tools] == [("deploy", "idempotent_write")]
    sink = TextSink(other_deltas="ignore")
    assert agent.model is not None
    first = await agent.model.respond(request([{"type": "user", "text": "go"}], tools), sink)
    assert (first.content, [c.name for c in first.tool_calls], sink.texts) == ("checked", ["deploy"], ["checking "])
    after = await agent.model.respond(request([{"type": "tool_result", "call_id": "d1"}], tools), sink)
    assert (after.content, after.tool_calls) == ("deployed", [])
    assert await agent.model.summarize([{"type": "user", "text": "go"}], None) == "1 items"
    assert framework.inline_runs == 1


async def test_a_segment_that_returns_a_call_of_no_deferred_tool_fails_the_attempt() -> None:
    agent = segment_agent("ops", FakeFramework(deferred_name="Bash"), [DeferredTool("deploy", deploy)])
    assert agent.model is not None
    with pytest.raises(ValueError, match="'Bash', which is not a deferred tool"):
        await agent.model.respond(
            request([{"type": "user", "text": "go"}], agent.definition()["tools"]), TextSink(other_deltas="ignore")
        )


def test_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="effect: deferred tool 'deploy'"):
        DeferredTool("deploy", deploy, effect="maybe")
    with pytest.raises(TypeError, match="fn:"):
        DeferredTool("deploy", "not a function")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="segment must have run"):
        SegmentModel(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"tools\[0\] must be a DeferredTool"):
        segment_agent("ops", FakeFramework(), [deploy])  # type: ignore[list-item]
