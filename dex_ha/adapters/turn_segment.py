"""Turn segments: how an agent framework that runs its own tool loop runs on dex-ha.

Some frameworks (the Claude Agent SDK, for one) do not hand each model call to the caller:
they run a loop of model calls and tool calls by themselves. dex-ha runs such a loop in
*segments*. A segment is the part of the loop between two durable points, and it runs
inside one RunModel attempt:

- everything the framework does by itself in the segment (its model calls, its built-in
  tools such as a shell or a file editor) runs inline, at least once: when the attempt
  fails (the Worker dies, the model API errs), the next attempt runs the whole segment
  again;
- a *deferred* tool ends the segment: when the framework calls one, the segment returns
  that call as the RunModel result's tool call, and dex-ha runs it as its own tool step
  with the effect you declared (read, idempotent_write, write). The next RunModel starts the
  next segment with the tool's result in the history.

A `TurnSegment` is one framework's way to run a segment. It gets the same `ModelRequest` a
model gets (the history, the summary, the deferred tools) and answers a `ModelResponse`:
the segment's text, and the deferred calls it ended on (none when the turn is done).
`segment_agent` makes the dex-ha `Agent` that runs it, with its deferred tools.

    agent = segment_agent("coder", MySegment(...), [DeferredTool("deploy", deploy, effect="write")])

This module imports no framework; each adapter (dex_ha.adapters.claude_agent) imports its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from dex_ha.adapters._common import DEFAULT_EFFECT
from dex_ha.worker.agent import EFFECTS, Agent, ToolFunction
from dex_ha.worker.model import DeltaSink, HistoryItem, ModelRequest, ModelResponse


@runtime_checkable
class TurnSegment(Protocol):
    """One framework's segment runner (see the module doc)."""

    async def run(self, request: ModelRequest, stream: DeltaSink) -> ModelResponse:
        """Run the framework from the history to its next deferred call (or the end of the
        turn). Everything it does on the way may run again in a later attempt."""
        ...

    async def summarize(self, history: list[HistoryItem], summary: str | None) -> str:
        """The new summary of `history` (after the old `summary`), for compaction."""
        ...


@dataclass(frozen=True)
class DeferredTool:
    """A tool whose calls end a segment and run as dex-ha tool steps.

    `fn(ctx, **arguments)` is the function the tool step runs (ctx is the ToolContext,
    with its idempotency key). `effect` says how dex-ha may repeat it: read (again after a
    crash), idempotent_write (again, with the same ctx.idempotency_key) or write (at most
    once; outcome_unknown if a crash hits it). The default is write: the safe choice for
    a tool you have not thought about.
    """

    name: str
    fn: ToolFunction
    effect: str = DEFAULT_EFFECT
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    approval: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name: a deferred tool needs a non-empty name, got {self.name!r}")
        if not callable(self.fn):
            raise TypeError(f"fn: the function of deferred tool {self.name!r} must be callable")
        if self.effect not in EFFECTS:
            raise ValueError(
                f"effect: deferred tool {self.name!r}: effect must be one of {', '.join(EFFECTS)}; got {self.effect!r}"
            )


class SegmentModel:
    """The dex-ha model of a segment agent: each RunModel runs one segment.

    It checks what the segment returns: a tool call must name a tool of the request (a
    deferred tool or a built-in such as ask_user); a framework tool that leaked out as a
    deferred call would otherwise fail as "no such tool" only after the attempt committed.
    """

    def __init__(self, segment: TurnSegment) -> None:
        if not isinstance(segment, TurnSegment):
            raise TypeError(
                f"segment must have run(request, stream) and summarize(history, summary); got {type(segment).__name__}"
            )
        self.segment = segment

    async def respond(self, request: ModelRequest, stream: DeltaSink) -> ModelResponse:
        response = ModelResponse.coerce(await self.segment.run(request, stream), "the segment's response")
        allowed = {tool.get("name") for tool in request.tools}
        for call in response.tool_calls:
            if call.name not in allowed:
                raise ValueError(
                    f"the segment returned a call of {call.name!r}, which is not a deferred "
                    f"tool of this agent (deferred: {sorted(n for n in allowed if n)})"
                )
        return response

    async def summarize(self, history: list[HistoryItem], summary: str | None) -> str:
        return await self.segment.summarize(history, summary)


def segment_agent(
    name: str,
    segment: TurnSegment,
    tools: Sequence[DeferredTool] = (),
    *,
    compaction: dict[str, int] | None = None,
    model_start_to_close_ms: int | None = None,
    description: str | None = None,
) -> Agent:
    """A dex-ha Agent whose RunModel runs `segment` and whose tools are `tools`, each a
    tool step of its own with its declared effect."""
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise TypeError("tools must be a list of DeferredTool")
    agent = Agent(
        name,
        SegmentModel(segment),
        compaction=compaction,
        model_start_to_close_ms=model_start_to_close_ms,
        description=description,
    )
    for i, deferred in enumerate(tools):
        if not isinstance(deferred, DeferredTool):
            raise TypeError(f"tools[{i}] must be a DeferredTool, got {type(deferred).__name__}")
        agent.tool(
            name=deferred.name,
            effect=deferred.effect,
            approval=deferred.approval,
            description=deferred.description,
            input_schema=deferred.input_schema,
        )(deferred.fn)
    return agent
