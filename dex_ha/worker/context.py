"""What a tool function sees while it runs: the ToolContext, and the values it may return.

A tool function is called as `fn(ctx, **arguments)`. Through `ctx` it learns which call
it serves (session, step, attempt, idempotency key), reports progress (`heartbeat`), asks
the user a question (`ask`), and builds the special results of a long-running tool
(`task_handle` from the tool, `pending` from its poll function).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

# How the Worker sends a heartbeat for the attempt a context belongs to. It gets the
# progress fields and answers False when the attempt must stop (cancel or stale).
HeartbeatSender = Callable[[dict[str, Any]], Awaitable[bool]]

DEFAULT_POLL_AFTER_MS = 1000


class ToolError(Exception):
    """Raised by a tool to report its own failure: the call records `failed` with
    `message`, the model sees it, and the tool is not run again."""

    def __init__(self, message: str) -> None:
        if not isinstance(message, str):
            raise TypeError(f"message must be a string, got {type(message).__name__}")
        super().__init__(message)
        self.message = message


class ArgumentsRefused(ToolError):
    """The call's arguments do not fit the tool function, so it was never called. Inside a
    model call (an inline tool) it is the tool's error, as any ToolError; for a tool step
    the Worker reports the attempt as not started (the tool did not run)."""


class NonRetryableError(Exception):
    """Raised by a model (or a tool) when another attempt would fail the same way: a 400 or
    401 from the model API, say. The attempt fails with `retryable=False`, so the step uses
    no attempt left: a model step fails its turn at once, with this message."""


class AttemptCancelled(Exception):
    """Raised by `ToolContext.heartbeat` when the server said stop (the turn was
    cancelled, or this attempt is no longer the current one). Whatever the tool returns
    afterwards is not delivered."""


class QuestionAsked(BaseException):
    """Raised by `ToolContext.ask` to end the attempt with a question.

    A BaseException on purpose (like asyncio.CancelledError): a tool's `except Exception`
    must not swallow it, or the question would never reach the user.
    """

    def __init__(self, question: Any) -> None:
        super().__init__(question)
        self.question = question


@dataclass(frozen=True, slots=True)
class TaskHandle:
    """Returned by a long-running tool: the server polls it later with `handle`."""

    handle: Any
    poll_after_ms: int = DEFAULT_POLL_AFTER_MS


@dataclass(frozen=True, slots=True)
class Pending:
    """Returned by a poll function: the task is not done yet; poll again later
    (after `poll_after_ms`, or the previous interval when None)."""

    poll_after_ms: int | None = None


class ToolContext:
    """The context of one tool run (one attempt of one call)."""

    def __init__(
        self,
        *,
        session_id: str,
        turn_id: str,
        step_id: str,
        call_id: str | None,
        attempt: int,
        idempotency_key: str | None,
        worker_id: str,
        answer: Any = None,
        has_answer: bool = False,
        send_heartbeat: HeartbeatSender | None = None,
    ) -> None:
        self.session_id = session_id
        self.turn_id = turn_id
        self.step_id = step_id
        self.call_id = call_id
        self.attempt = attempt
        self.idempotency_key = idempotency_key
        self.worker_id = worker_id
        # The user's answer to the question this tool asked in an earlier run. A JSON
        # null is an answer too, hence the separate flag.
        self.answer = answer
        self.has_answer = has_answer
        # Set by the Worker when the server cancels the attempt; a sync tool running in
        # a thread cannot be interrupted, so it should check this between units of work.
        self.cancelled = False
        self._send_heartbeat = send_heartbeat

    async def heartbeat(self, **progress: Any) -> None:
        """Send a heartbeat now (with `progress` as a delta when given).

        Raises AttemptCancelled when the server answers that this attempt must stop.
        Without a Worker (a context built by hand in a test) this does nothing.
        """
        if self.cancelled:
            raise AttemptCancelled(f"attempt {self.attempt} of step {self.step_id} was cancelled")
        if self._send_heartbeat is None:
            return
        if not await self._send_heartbeat(progress):
            self.cancelled = True
            raise AttemptCancelled(f"attempt {self.attempt} of step {self.step_id} was cancelled")

    async def ask(self, question: Any) -> Any:
        """Ask the user `question` (any JSON value) and return the answer.

        The first run ends here: the attempt completes with `{"status": "question"}`.
        Once the user answers, the step runs again from the start with the answer, and
        this call returns it at once. A tool asks one question per call: ask them
        together in one question if it needs several answers.
        """
        if self.has_answer:
            return self.answer
        raise QuestionAsked(question)

    def task_handle(self, handle: Any, poll_after_ms: int = DEFAULT_POLL_AFTER_MS) -> TaskHandle:
        """The result of a tool that started long-running work: the server calls the
        tool's poll function with `handle` after `poll_after_ms`, until it is done."""
        if handle is None:
            raise ValueError("handle must not be None (the server polls with it)")
        _check_poll_after(poll_after_ms)
        return TaskHandle(handle, poll_after_ms)

    def pending(self, poll_after_ms: int | None = None) -> Pending:
        """The result of a poll function whose task is not done yet."""
        if poll_after_ms is not None:
            _check_poll_after(poll_after_ms)
        return Pending(poll_after_ms)

    def __repr__(self) -> str:
        return (
            f"ToolContext(step_id={self.step_id!r}, call_id={self.call_id!r}, "
            f"attempt={self.attempt}, idempotency_key={self.idempotency_key!r})"
        )


def _check_poll_after(poll_after_ms: Any) -> None:
    if not isinstance(poll_after_ms, int) or isinstance(poll_after_ms, bool) or poll_after_ms < 0:
        raise ValueError(f"poll_after_ms must be a non-negative integer, got {poll_after_ms!r}")
