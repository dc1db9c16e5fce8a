"""dex_ha.adapters — run an agent written for another framework durably on dex-ha.

Each adapter turns a framework agent into a dex_ha.worker.Agent: every model call becomes a
RunModel step and every function tool its own tool step, with the effect you declare.
Import the one you use; this package imports none of them:

    from dex_ha.adapters.openai_agents import durable_agent  # pip install -e '.[openai-agents]'
    from dex_ha.adapters.pydantic_ai import durable_agent    # pip install -e '.[pydantic-ai]'
    from dex_ha.adapters.claude_agent import durable_agent   # pip install -e '.[claude-agent]'

The adapters share how a tool's effect is declared (`effect`, or a mapping passed to
`durable_agent`; undeclared tools are "write") and `tool_context()`, the dex-ha context of
the tool step running now (its idempotency key, attempt, heartbeat).

A framework that runs its own tool loop (the Claude Agent SDK) runs in turn segments
instead (dex_ha.adapters.turn_segment): its own model calls and tools run inside RunModel,
at least once; the tools you give it are deferred, each its own tool step.
"""

from dex_ha.adapters._common import DEFAULT_EFFECT, effect, tool_context

__all__ = ["DEFAULT_EFFECT", "effect", "tool_context"]
