"""A Claude Agent SDK agent for tests, and the fake Anthropic API's script for it.

The agent (`coder_agent`) runs the real Claude Code CLI (the SDK's bundled one) against
harness/fake_models/anthropic_api.py: its turn segment runs the CLI's Bash tool inline (it
appends a line to `inline.log`) and calls the deferred tool `put_record`, which records
each run in the crash ledger with its idempotency key.

`ScriptedCoder` is the fake API's responder. It answers from what the request shows, never
from a count, so a repeated or replayed segment gets the same answers:

1. no tool used yet                -> "Writing the file." + Bash(echo inline >> inline.log)
2. Bash used, put_record not yet   -> put_record(key=k1, value=v1); with `stall_once`, the
                                      first such answer hangs before its first delta
3. put_record used                 -> "All done."
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from harness.fake_models.anthropic_api import Reply, tool_use

DEFERRED_TOOL = "put_record"
DEFERRED_TOOL_CLI_NAME = f"mcp__dex__{DEFERRED_TOOL}"
FINAL_TEXT = "All done."
INLINE_LOG = "inline.log"
MODEL = "claude-sonnet-4-5"


def cli_missing_reason() -> str | None:
    """Why the Claude adapter cannot run here (None: it can)."""
    if importlib.util.find_spec("claude_agent_sdk") is None:
        return "claude-agent-sdk is not installed (pip install -e '.[claude-agent]' in the dex-ha clone)"
    from claude_agent_sdk import ClaudeAgentOptions

    from dex_ha.adapters.claude_agent import cli_path_of

    cli = cli_path_of(ClaudeAgentOptions())
    if cli is None or not os.access(cli, os.X_OK):
        return (
            "no Claude Code CLI: the claude-agent-sdk wheel bundles none for this platform and `claude` is not on PATH"
        )
    return None


def tools_used(body: dict[str, Any]) -> set[str]:
    """The names of the tool_use blocks in a Messages request's assistant messages."""
    return {
        block["name"]
        for message in body.get("messages", [])
        if message.get("role") == "assistant" and isinstance(message.get("content"), list)
        for block in message["content"]
        if isinstance(block, dict) and block.get("type") == "tool_use"
    }


def stage(body: dict[str, Any]) -> int:
    """1, 2 or 3: which answer of the script a request gets (see the module doc)."""
    used = tools_used(body)
    return 3 if DEFERRED_TOOL_CLI_NAME in used else 2 if "Bash" in used else 1


class ScriptedCoder:
    """The responder of FakeAnthropic for the coder agent (see the module doc)."""

    def __init__(self, work_dir: Path, *, stall_once: bool = False) -> None:
        self.inline_log = work_dir / INLINE_LOG
        self.stall_once = stall_once

    def __call__(self, body: dict[str, Any]) -> Reply:
        step = stage(body)
        if step == 1:
            return Reply.of(
                "Writing the file.",
                tool_use("Bash", {"command": f"echo inline >> {self.inline_log}", "description": "Append a line"}),
            )
        if step == 2:
            stall, self.stall_once = self.stall_once, False
            return Reply.of(
                tool_use(DEFERRED_TOOL_CLI_NAME, {"key": "k1", "value": "v1"}), stall_after_deltas=0 if stall else None
            )
        return Reply.of(FINAL_TEXT)


def inline_runs(work_dir: Path) -> int:
    """How many times the segment's Bash command ran (lines in inline.log)."""
    path = work_dir / INLINE_LOG
    return len(path.read_text().splitlines()) if path.exists() else 0


def coder_agent(name: str, *, api_url: str, work_dir: Path, ledger_path: Path) -> Any:
    """The dex-ha Agent: the CLI with Bash in `work_dir`, and put_record (effect write)."""
    from claude_agent_sdk import ClaudeAgentOptions, tool

    from dex_ha.adapters.claude_agent import durable_agent
    from dex_ha.worker import ToolContext
    from tests.crash.ledger import Ledger

    ledger = Ledger(ledger_path)

    @tool(DEFERRED_TOOL, "Store a record", {"key": str, "value": str})
    # The SDK types a handler as taking the arguments alone, so ctx needs a default to be
    # accepted by @tool; dex-ha's tool step passes it to a handler that takes two.
    async def put_record(args: dict[str, Any], ctx: ToolContext | None = None) -> dict[str, Any]:
        assert ctx is not None, "dex-ha's tool step passes the ToolContext"
        ledger.record(
            "tool",
            DEFERRED_TOOL,
            "started",
            call_id=ctx.call_id,
            key=ctx.idempotency_key,
            attempt=ctx.attempt,
            data=args,
        )
        ledger.record(
            "tool", DEFERRED_TOOL, "finished", call_id=ctx.call_id, key=ctx.idempotency_key, attempt=ctx.attempt
        )
        return {"content": [{"type": "text", "text": f"stored {args['key']}"}]}

    options = ClaudeAgentOptions(
        model=MODEL,
        cwd=str(work_dir),
        tools=["Bash"],
        allowed_tools=["Bash"],
        env={
            "ANTHROPIC_BASE_URL": api_url,
            "ANTHROPIC_API_KEY": "sk-test-fake",
            "CLAUDE_CONFIG_DIR": str(work_dir / ".claude-config"),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
        },
    )
    return durable_agent(name, options, tools=[put_record])
