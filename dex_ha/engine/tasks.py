"""The `input` of a Worker's task, by step kind, exactly as docs/api.md gives it.

One function for both places a task is built: inside the apply that hands the step out
(from the history cache, `warm=True`: the Worker's answer needs no read of the database),
and the `task_for` query (from the tables). They give the same input for the same state.
"""

from __future__ import annotations

from typing import Any

from dex_ha.engine.agents import model_tools
from dex_ha.engine.kinds import StepKind
from dex_ha.engine.store import Store, from_json

TOOL_KINDS = (StepKind.CALL_TOOL, StepKind.CALL_SINGLE_ATTEMPT_TOOL, StepKind.POLL_TOOL_TASK)


def task_input(store: Store, step: Any, *, warm: bool) -> dict[str, Any]:
    """The task input of `step` (a steps row, or a hand-out with its kind, session_id,
    agent and params); `warm`: from the store's history cache (inside an apply)."""
    kind = step["kind"]
    if kind in TOOL_KINDS:
        params: dict[str, Any] = from_json(step["params"])
        return params
    session_id = step["session_id"]
    history = store.warm_session_history(session_id) if warm else store.session_history(session_id)
    task: dict[str, Any]
    if kind == StepKind.RUN_MODEL:
        definition = store.warm_agent_definition(step["agent"]) if warm else store.agent_definition(step["agent"])
        # A copy: the cached list grows with the session, the task must not.
        task = {"history": list(history.items), "tools": model_tools(definition)}
    elif kind == StepKind.COMPACT_CONTEXT:
        upto = from_json(step["params"])["upto_seq"]
        task = {"history": history.items[: max(0, upto - history.summary_upto_seq)]}
    else:  # pragma: no cover - only task kinds are handed out
        raise AssertionError(kind)
    if history.summary is not None:
        task["summary"] = history.summary
    return task
