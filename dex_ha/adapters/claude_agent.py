"""Run a Claude Agent SDK agent durably on dex-ha (pip install -e '.[claude-agent]').

    from claude_agent_sdk import ClaudeAgentOptions, tool
    from dex_ha.adapters.claude_agent import durable_agent

    @tool("deploy", "Deploy a service", {"service": str})
    async def deploy(args, ctx):              # ctx (optional): the dex-ha ToolContext
        ...
        return {"content": [{"type": "text", "text": "deployed"}]}

    agent = durable_agent("ops", ClaudeAgentOptions(cwd="/srv/work", allowed_tools=["Bash", "Read"]),
                          tools=[deploy], effects={"deploy": "write"})
    await Worker(urls, token=..., agents=[agent]).run()

The SDK drives the Claude Code CLI, which runs its own loop of model calls and tools. Here
that loop runs in turn segments (dex_ha.adapters.turn_segment): each RunModel attempt runs
the CLI from the session's history to its next call of one of *your* tools (the SDK MCP
tools you pass as `tools`), or to the end of the turn.

- Inline, at least once: the CLI's model calls and its own tools (Bash, Read, Write, Edit,
  Task, ...), and tools of other MCP servers in `options`. A RunModel attempt that fails
  (its Worker dies, the API errs) runs the whole segment again.
- Deferred, durable: your tools. When the CLI calls one, the segment ends and RunModel
  returns the call; dex-ha runs it as its own CallTool step (CallSingleAttemptTool for a
  `write`) with the effect you declare in `effects` (default `write`).

How a segment resumes after a deferred tool: by replaying the conversation. Each segment
starts a fresh CLI and gives it the session's history (from dex-ha, where it is durable) as
a resumed CLI session: the history becomes a transcript (user, assistant with the deferred
tool_use blocks, tool_result), loaded through the SDK's `session_store` and `resume`.
When the history ends with tool results, the CLI continues the interrupted turn
(CLAUDE_CODE_RESUME_INTERRUPTED_TURN=1); when it ends with a user message, that message is
the prompt. Nothing is kept on the Worker's disk between segments, so any Worker can run
the next one. What a replay leaves out: the inline tool calls of earlier segments (their
effects are on disk, their transcripts are not); the model sees each earlier segment as its
text and its deferred calls.

On Linux the CLI runs under a small launcher (dex_ha.adapters.claude_launcher) that kills it
and its commands when the Worker process dies, so that a segment never runs on after its
Worker is gone while dex-ha runs it again elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import claude_agent_sdk
from claude_agent_sdk import (
    AssistantMessage,
    ClaudeAgentOptions,
    ClaudeSDKClient,
    ResultMessage,
    SdkMcpTool,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    UserMessage,
    create_sdk_mcp_server,
)

from dex_ha.adapters import claude_launcher
from dex_ha.adapters.turn_segment import DeferredTool, TurnSegment, segment_agent
from dex_ha.worker.agent import Agent, schema_of_annotation
from dex_ha.worker.context import NonRetryableError, ToolContext, ToolError
from dex_ha.worker.model import DeltaSink, HistoryItem, ModelRequest, ModelResponse, ToolCall

DEFAULT_SERVER_NAME = "dex"
# The CLI continues a resumed turn that ended with tool results, instead of waiting for a prompt.
RESUME_INTERRUPTED_TURN_ENV = "CLAUDE_CODE_RESUME_INTERRUPTED_TURN"
# Errors another attempt would meet again: the attempt fails with no retry.
NON_RETRYABLE_ERRORS = frozenset({"authentication_failed", "billing_error", "invalid_request"})
# How long to wait for the CLI to acknowledge the interrupt that ends a segment.
INTERRUPT_TIMEOUT_S = 5.0
SUMMARY_PROMPT = (
    "Summarize the conversation below for your own later use: the user's requests, what was "
    "done, the results of tool calls, and what is still open. Answer with the summary only."
)


# ---------------------------------------------------------------- the agent


def durable_agent(
    name: str,
    options: ClaudeAgentOptions | None = None,
    *,
    tools: Sequence[SdkMcpTool[Any]] = (),
    effects: Mapping[str, str] | None = None,
    approval: Sequence[str] = (),
    server_name: str = DEFAULT_SERVER_NAME,
    compaction: dict[str, int] | None = None,
    model_start_to_close_ms: int | None = None,
    description: str | None = None,
) -> Agent:
    """A dex-ha Agent that runs the Claude Agent SDK with `options`, in turn segments.

    `tools` are your SDK MCP tools (`@tool`): each runs as a durable dex-ha tool step with
    `effects[name]` ("read", "idempotent_write" or "write", the default); the ones named in
    `approval` wait for a user's approval first. They are served to the CLI as the MCP
    server `server_name` (mcp__{server_name}__{tool}), so that name must not be one of
    `options.mcp_servers`.
    """
    effects = dict(effects or {})
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise TypeError("tools must be a list of SDK MCP tools (made with claude_agent_sdk.tool)")
    names = [getattr(t, "name", None) for t in tools]
    unknown = sorted(set(effects) - set(names)) or sorted(set(approval) - set(names))
    if unknown:
        raise ValueError(f"effects/approval: {unknown[0]!r} is not one of the tools {names}")
    deferred = [deferred_tool(t, effects.get(t.name, "write"), approval=t.name in approval) for t in tools]
    segment = ClaudeTurnSegment(options, server_name=server_name)
    return segment_agent(
        name,
        segment,
        deferred,
        compaction=compaction,
        model_start_to_close_ms=model_start_to_close_ms,
        description=description,
    )


def deferred_tool(sdk_tool: SdkMcpTool[Any], effect: str = "write", *, approval: bool = False) -> DeferredTool:
    """An SDK MCP tool as a dex-ha deferred tool.

    The tool step calls the tool's handler with the call's arguments, and with the
    ToolContext as a second argument when the handler takes two (for ctx.idempotency_key).
    A result with `is_error` raises ToolError (the model sees the error; the tool is not run
    again); any other result is the call's output, as the handler returned it.
    """
    if not isinstance(sdk_tool, SdkMcpTool):
        raise TypeError(f"tool must be an SDK MCP tool (claude_agent_sdk.tool), got {type(sdk_tool).__name__}")
    # The SDK types the handler as taking the arguments alone; a handler may also take the
    # ToolContext, which _positional_count finds out, so it is called with one or two.
    handler: Callable[..., Any] = sdk_tool.handler
    wants_context = _positional_count(handler) >= 2

    async def run(ctx: ToolContext, **arguments: Any) -> Any:
        result = await (handler(arguments, ctx) if wants_context else handler(arguments))
        if isinstance(result, dict) and result.get("is_error"):
            raise ToolError(content_text(result.get("content")) or f"tool {sdk_tool.name!r} failed")
        return result

    run.__name__ = sdk_tool.name
    return DeferredTool(
        sdk_tool.name,
        run,
        effect=effect,
        description=sdk_tool.description,
        input_schema=json_schema(sdk_tool.input_schema),
        approval=approval,
    )


def json_schema(input_schema: Any) -> dict[str, Any]:
    """The JSON schema of an SDK tool's input_schema: a JSON schema as it is, or a dict of
    parameter name to Python type (all required), or a TypedDict."""
    if isinstance(input_schema, dict) and isinstance(input_schema.get("type"), str) and "properties" in input_schema:
        return input_schema
    if isinstance(input_schema, dict):
        fields = input_schema
    elif typing.is_typeddict(input_schema):
        fields = typing.get_type_hints(input_schema)
    else:
        return {"type": "object", "properties": {}}
    properties = {name: schema_of_annotation(annotation) for name, annotation in fields.items()}
    return {"type": "object", "properties": properties, "required": list(properties)}


# ---------------------------------------------------------------- the segment


class ClaudeTurnSegment(TurnSegment):
    """Runs one segment of a Claude Agent SDK agent (see the module doc).

    `options` are the SDK's: model, cwd, system prompt, the CLI tools allowed, env (for
    example ANTHROPIC_BASE_URL), ... The segment adds the deferred tools' MCP server,
    allows those tools, and sets `resume` and `session_store` itself.
    """

    def __init__(
        self,
        options: ClaudeAgentOptions | None = None,
        *,
        server_name: str = DEFAULT_SERVER_NAME,
        kill_with_worker: bool = True,
    ) -> None:
        if options is None:
            options = ClaudeAgentOptions()
        if not isinstance(options, ClaudeAgentOptions):
            raise TypeError(f"options must be a ClaudeAgentOptions, got {type(options).__name__}")
        if not isinstance(server_name, str) or not server_name or "__" in server_name:
            raise ValueError(f"server_name must be a non-empty name without '__', got {server_name!r}")
        if isinstance(options.mcp_servers, dict) and server_name in options.mcp_servers:
            raise ValueError(f"server_name: options.mcp_servers already has a server named {server_name!r}")
        for field in ("resume", "session_store", "continue_conversation"):
            if getattr(options, field):
                raise ValueError(f"options.{field}: the segment sets it itself; leave it unset")
        self.options = options
        self.server_name = server_name
        self.kill_with_worker = kill_with_worker and sys.platform.startswith("linux")

    def mcp_name(self, tool_name: str) -> str:
        """The name the CLI (and the model) knows a deferred tool by."""
        return f"mcp__{self.server_name}__{tool_name}"

    async def run(self, request: ModelRequest, stream: DeltaSink) -> ModelResponse:
        tools = {tool["name"]: tool for tool in request.tools}
        replay = Replay.of(request.history, request.summary, self.mcp_name, self._cwd(), self.options.model)
        run = SegmentRun({self.mcp_name(name): name for name in tools}, stream)
        server = create_sdk_mcp_server(
            self.server_name,
            tools=[
                SdkMcpTool(
                    name,
                    tool.get("description") or name,
                    tool.get("input_schema") or {"type": "object", "properties": {}},
                    run.deferring_handler(name),
                )
                for name, tool in tools.items()
            ],
        )
        options = self._segment_options(replay, {self.server_name: server}, [self.mcp_name(n) for n in tools])
        with self._launcher() as launch:
            await run.drive(launch.options(options), replay.prompt, launch)
        return run.response()

    async def summarize(self, history: list[HistoryItem], summary: str | None) -> str:
        """A summary written by the same CLI and model, with no tools. The history goes in as
        text in the prompt: a request without tools may not carry tool_use blocks."""
        prompt = f"{SUMMARY_PROMPT}\n\n<conversation>\n{history_as_text(history, summary)}\n</conversation>"
        replay = Replay.of([{"type": "user", "text": prompt}], None, self.mcp_name, self._cwd(), self.options.model)
        options = dataclasses.replace(self._segment_options(replay, {}, []), tools=[], allowed_tools=[], max_turns=1)
        run = SegmentRun({}, None)
        with self._launcher() as launch:
            await run.drive(launch.options(options), replay.prompt, launch)
        return run.response().content

    # ------------------------------------------------------------ helpers

    def _cwd(self) -> str:
        return str(self.options.cwd) if self.options.cwd is not None else os.getcwd()

    def _segment_options(self, replay: Replay, servers: dict[str, Any], allowed: list[str]) -> ClaudeAgentOptions:
        base = self.options
        mcp_servers = {**base.mcp_servers, **servers} if isinstance(base.mcp_servers, dict) else base.mcp_servers
        env = dict(base.env)
        if replay.continues_turn:
            env[RESUME_INTERRUPTED_TURN_ENV] = "1"
        options = dataclasses.replace(
            base, mcp_servers=mcp_servers, env=env, allowed_tools=[*base.allowed_tools, *allowed]
        )
        if replay.entries:
            options = dataclasses.replace(
                options,
                resume=replay.session_id,
                session_store=_as_session_store(ReplayStore(replay.session_id, replay.entries)),
            )
        return options

    @contextlib.contextmanager
    def _launcher(self) -> typing.Iterator[Launch]:
        """How to start (and stop) this segment's CLI: under claude_launcher on Linux."""
        cli = cli_path_of(self.options)
        if not self.kill_with_worker or cli is None:
            yield Launch(None, None)
            return
        with tempfile.TemporaryDirectory(prefix="dex-claude-") as directory:
            script, pid_file = Path(directory) / "claude", Path(directory) / "launcher.pid"
            command = [sys.executable, claude_launcher.__file__, str(pid_file), str(os.getpid()), cli]
            script.write_text(f'#!/bin/sh\nexec {shlex.join(command)} "$@"\n')
            script.chmod(0o700)
            yield Launch(str(script), pid_file)


@dataclasses.dataclass(frozen=True)
class Launch:
    """The cli_path to give the SDK (None: its own choice), and where the launcher wrote its pid."""

    cli_path: str | None
    pid_file: Path | None

    def options(self, options: ClaudeAgentOptions) -> ClaudeAgentOptions:
        return options if self.cli_path is None else dataclasses.replace(options, cli_path=self.cli_path)

    def kill(self) -> bool:
        """Stop the CLI and its commands now (SIGTERM to the launcher); False without a launcher."""
        if self.pid_file is None:
            return False
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int(self.pid_file.read_text()), signal.SIGTERM)
            return True
        return False


def cli_path_of(options: ClaudeAgentOptions) -> str | None:
    """The CLI the SDK would start: options.cli_path, the SDK's bundled one, or `claude` on PATH."""
    if options.cli_path is not None:
        return str(options.cli_path)
    bundled = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
    if bundled.is_file():
        return str(bundled)
    return shutil.which("claude")


class SegmentRun:
    """One CLI run: what it said, which deferred calls it made, and when it is over.

    The segment is over when the CLI ends its turn (a ResultMessage), or when the model's
    latest message called deferred tools and the CLI has reached every one of them (their
    handlers were entered; they never return) and has the results of that message's other
    (inline) calls. The CLI is then stopped: nothing after that point runs.
    """

    def __init__(self, deferred_names: dict[str, str], stream: DeltaSink | None) -> None:
        self.deferred_names = deferred_names  # CLI name -> dex-ha tool name
        self.stream = stream
        self.texts: list[str] = []
        self.message_id: str | None = None
        self.deferred: list[ToolCall] = []  # of the latest model message
        self.inline_pending: set[str] = set()  # tool_use ids of that message without a result yet
        self.entered = 0  # deferred handlers the CLI has called
        self.usage: dict[str, int] = {"model_calls": 0, "input_tokens": 0, "output_tokens": 0}
        self.result: ResultMessage | None = None
        self.error: Exception | None = None
        self.changed = asyncio.Event()

    def deferring_handler(self, name: str) -> Callable[[dict[str, Any]], typing.Awaitable[dict[str, Any]]]:
        async def handler(arguments: dict[str, Any]) -> dict[str, Any]:
            self.entered += 1
            self.changed.set()
            await asyncio.Event().wait()  # the segment ends here; the CLI is stopped before any answer
            raise AssertionError("unreachable")

        handler.__name__ = name
        return handler

    @property
    def over(self) -> bool:
        if self.result is not None or self.error is not None:
            return True
        return bool(self.deferred) and self.entered >= len(self.deferred) and not self.inline_pending

    async def drive(self, options: ClaudeAgentOptions, prompt: str | None, launch: Launch) -> None:
        async with ClaudeSDKClient(options) as client:
            if prompt is not None:
                await client.query(prompt)
            reader = asyncio.create_task(self._read(client))
            reader.add_done_callback(lambda _: self.changed.set())
            try:
                while not self.over and not reader.done():
                    await self.changed.wait()
                    self.changed.clear()
                if reader.done() and reader.exception() is not None:
                    raise reader.exception()  # type: ignore[misc]
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await reader
                if not self.result and not launch.kill():  # stop the CLI now: nothing after this point runs
                    with contextlib.suppress(Exception):  # no launcher: interrupt the turn, then close
                        await asyncio.wait_for(client.interrupt(), INTERRUPT_TIMEOUT_S)
        if self.error is not None:
            raise self.error

    async def _read(self, client: ClaudeSDKClient) -> None:
        async for message in client.receive_messages():
            self.take(message)
            self.changed.set()
            if self.over:
                return
        self.error = self.error or RuntimeError("the Claude Code CLI ended its output before the turn ended")

    def take(self, message: Any) -> None:
        if isinstance(message, AssistantMessage) and message.parent_tool_use_id is None:
            self._take_assistant(message)
        elif isinstance(message, UserMessage) and isinstance(message.content, list):
            for block in message.content:
                if isinstance(block, ToolResultBlock):
                    self.inline_pending.discard(block.tool_use_id)
        elif isinstance(message, ResultMessage):
            if message.is_error:
                self.error = RuntimeError(
                    f"the Claude Code CLI ended the turn with an error: "
                    f"{message.subtype}: {message.result or ''}".rstrip(": ")
                )
            self.result = message

    def _take_assistant(self, message: AssistantMessage) -> None:
        if message.error is not None:
            kind = NonRetryableError if message.error in NON_RETRYABLE_ERRORS else RuntimeError
            self.error = kind(f"the model API answered {message.error}: {content_text(message.content)}")
            return
        if message.message_id != self.message_id:  # a new model response (the CLI sends it block by block)
            self.message_id = message.message_id
            self.deferred, self.inline_pending = [], set()
            self.usage["model_calls"] += 1
            for key in ("input_tokens", "output_tokens"):
                self.usage[key] += int((message.usage or {}).get(key) or 0)
        for block in message.content:
            if isinstance(block, TextBlock) and block.text:
                self.texts.append(block.text)
                if self.stream is not None:
                    self.stream.send_text(block.text)
            elif isinstance(block, ToolUseBlock) and block.name in self.deferred_names:
                self.deferred.append(ToolCall(block.id, self.deferred_names[block.name], dict(block.input)))
            elif isinstance(block, ToolUseBlock):
                self.inline_pending.add(block.id)

    def response(self) -> ModelResponse:
        """The RunModel answer: the segment's text and the deferred calls it ended on."""
        calls = [] if self.result is not None else list(self.deferred)
        return ModelResponse("\n\n".join(self.texts), calls, dict(self.usage))


# ---------------------------------------------------------------- replay


@dataclasses.dataclass
class Replay:
    """The session's history as a CLI transcript, and how the CLI goes on from it: with
    `prompt` (the last user message), or by continuing the interrupted turn."""

    session_id: str
    entries: list[dict[str, Any]]
    prompt: str | None

    @property
    def continues_turn(self) -> bool:
        return self.prompt is None and bool(self.entries)

    @classmethod
    def of(
        cls,
        history: Sequence[HistoryItem],
        summary: str | None,
        mcp_name: Callable[[str], str],
        cwd: str,
        model: str | None,
    ) -> Replay:
        items = list(history)
        prompt = None
        if items and items[-1].get("type") == "user":
            prompt = str(items.pop().get("text", ""))
        messages = conversation(items, summary, mcp_name)
        session_id = str(uuid.uuid4())
        if prompt is None and not messages:
            raise ValueError("history: a segment needs a user message or tool results to go on from")
        return cls(session_id, transcript(messages, session_id, cwd, model), prompt)


def conversation(
    history: Sequence[HistoryItem], summary: str | None, mcp_name: Callable[[str], str]
) -> list[dict[str, Any]]:
    """The history as Messages API messages, consecutive items of one role in one message."""
    messages: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": list(blocks)})

    if summary:
        add("user", [_text(f"Summary of the conversation so far:\n{summary}")])
    for i, item in enumerate(history):
        kind = item.get("type")
        if kind == "user":
            add("user", [_text(str(item.get("text", "")))])
        elif kind == "note":
            add("user", [_text(f"Note: {item.get('text', '')}")])
        elif kind == "assistant":
            add("assistant", assistant_blocks(item, mcp_name))
        elif kind == "tool_result":
            add("user", [tool_result_block(item)])
        else:
            raise ValueError(f"history[{i}]: unknown item type {kind!r}")
    return messages


def assistant_blocks(item: HistoryItem, mcp_name: Callable[[str], str]) -> list[dict[str, Any]]:
    blocks = [_text(item["content"])] if item.get("content") else []
    blocks += [
        {"type": "tool_use", "id": call["id"], "name": mcp_name(call["name"]), "input": call.get("arguments") or {}}
        for call in item.get("tool_calls") or []
    ]
    return blocks or [_text("(no content)")]


def tool_result_block(item: HistoryItem) -> dict[str, Any]:
    """A deferred call's outcome as the model sees it: the tool's MCP content when it
    returned some, its output as JSON otherwise, or its error."""
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": item["call_id"]}
    if item.get("status") == "succeeded":
        output = item.get("output")
        content = output.get("content") if isinstance(output, dict) else None
        block["content"] = (
            content if _is_blocks(content) else (output if isinstance(output, str) else json.dumps(output))
        )
    else:
        block["content"] = f"{item.get('status')}: {item.get('error') or ''}".rstrip(": ")
        block["is_error"] = True
    return block


def transcript(messages: list[dict[str, Any]], session_id: str, cwd: str, model: str | None) -> list[dict[str, Any]]:
    """Messages as CLI transcript entries (one JSON object a line in a session file)."""
    entries: list[dict[str, Any]] = []
    parent = None
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    for number, message in enumerate(messages):
        body: dict[str, Any] = dict(message)
        if message["role"] == "assistant":
            uses_tools = any(block["type"] == "tool_use" for block in message["content"])
            body = {
                "id": f"msg_dexreplay{number}",
                "type": "message",
                "role": "assistant",
                "model": model or "replayed",
                "content": message["content"],
                "stop_reason": "tool_use" if uses_tools else "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0},
            }
        entry = {
            "type": message["role"],
            "uuid": str(uuid.uuid4()),
            "parentUuid": parent,
            "sessionId": session_id,
            "isSidechain": False,
            "userType": "external",
            "cwd": cwd,
            "timestamp": now,
            "message": body,
        }
        entries.append(entry)
        parent = entry["uuid"]
    return entries


def history_as_text(history: Sequence[HistoryItem], summary: str | None) -> str:
    """The history as plain text, one item a paragraph, for a summary."""
    lines = [f"Earlier summary: {summary}"] if summary else []
    for item in history:
        kind = item.get("type")
        if kind == "user":
            lines.append(f"User: {item.get('text', '')}")
        elif kind == "note":
            lines.append(f"Note: {item.get('text', '')}")
        elif kind == "assistant":
            calls = "".join(
                f"\n[called {c['name']}({json.dumps(c.get('arguments') or {})}), call {c['id']}]"
                for c in item.get("tool_calls") or []
            )
            lines.append(f"Assistant: {item.get('content') or ''}{calls}")
        elif kind == "tool_result":
            block = tool_result_block(item)
            lines.append(f"Result of call {item.get('call_id')} ({item.get('name')}): {content_text(block['content'])}")
    return "\n\n".join(lines)


class ReplayStore:
    """A SessionStore (the SDK's protocol) that serves one replayed session to `resume`,
    and drops what the CLI mirrors back: the durable record is dex-ha's history."""

    def __init__(self, session_id: str, entries: list[dict[str, Any]]) -> None:
        self.session_id = session_id
        self.entries = entries

    async def append(self, key: Mapping[str, Any], entries: list[dict[str, Any]]) -> None:
        return None

    async def load(self, key: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        if key.get("session_id") != self.session_id or key.get("subpath"):
            return None
        return self.entries


# ---------------------------------------------------------------- small helpers


def _as_session_store(store: ReplayStore) -> claude_agent_sdk.SessionStore:
    """`store` as the SDK's SessionStore protocol. ReplayStore has the two methods the
    protocol requires (append, load); the optional ones the SDK probes for at runtime, and
    the protocol's dict entry types are TypedDicts of the JSON lines ReplayStore passes on."""
    return typing.cast(claude_agent_sdk.SessionStore, store)


def content_text(content: Any) -> str:
    """The text of MCP or message content blocks (or a string)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = [b.get("text", "") if isinstance(b, dict) else getattr(b, "text", "") for b in content]
        return "\n".join(p for p in pieces if p)
    return ""


def _is_blocks(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(b, dict) and "type" in b for b in value)


def _text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def _positional_count(fn: Callable[..., Any]) -> int:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    return sum(1 for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
