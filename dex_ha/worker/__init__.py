"""dex_ha.worker — the Worker SDK.

Declare an :class:`Agent` with a model and tools, hand it to a :class:`Worker`, and run
the Worker: it registers the agent, long-polls the server for tasks, runs model calls and
tool functions with heartbeats, and delivers their results.
"""

from dex_ha.worker.agent import BUILTIN_TOOL_NAMES, EFFECTS, Agent, Tool, infer_input_schema
from dex_ha.worker.context import AttemptCancelled, NonRetryableError, Pending, TaskHandle, ToolContext, ToolError
from dex_ha.worker.model import (
    DeltaSink,
    Model,
    ModelRequest,
    ModelResponse,
    ScriptedModel,
    ScriptExhausted,
    ToolCall,
)
from dex_ha.worker.runner import Worker, WorkerTask

__all__ = [
    "BUILTIN_TOOL_NAMES",
    "EFFECTS",
    "Agent",
    "AttemptCancelled",
    "DeltaSink",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "NonRetryableError",
    "Pending",
    "ScriptExhausted",
    "ScriptedModel",
    "TaskHandle",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "Worker",
    "WorkerTask",
    "infer_input_schema",
]
