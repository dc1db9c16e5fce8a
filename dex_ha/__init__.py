"""dex-ha: a durable execution server for AI agent sessions, run as a Raft cluster."""

# The release: the one place it is written (pyproject.toml reads it). 0.1.0 was the first;
# this is the code on the way to 0.2.0.
__version__ = "0.2.0.dev0"

# Contract: the error of a tool call that never reached a Worker starts
# with this string, so the model and callers know it is safe to call the tool again.
TOOL_CALL_NOT_RUN_ERROR_PREFIX = "the tool did not run, so it is safe to call again"

__all__ = ["TOOL_CALL_NOT_RUN_ERROR_PREFIX", "__version__"]
