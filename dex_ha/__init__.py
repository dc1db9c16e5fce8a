"""dex-ha: a durable execution server for AI agent sessions, run as a Raft cluster."""

__version__ = "0.1.0"

# Contract: the error of a tool call that never reached a Worker starts
# with this string, so the model and callers know it is safe to call the tool again.
TOOL_CALL_NOT_RUN_ERROR_PREFIX = "the tool did not run, so it is safe to call again"

__all__ = ["TOOL_CALL_NOT_RUN_ERROR_PREFIX", "__version__"]
