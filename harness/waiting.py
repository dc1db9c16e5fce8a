"""Waiting in tests and benches: poll a condition until it holds, with a deadline, never a bare sleep.

The one helper for it; every test package and harness module imports it from here.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def eventually(
    check: Callable[[], Any | Awaitable[Any]],
    what: str | None = None,
    deadline_s: float = 30.0,
    interval_s: float = 0.05,
) -> Any:
    """Poll `check()` (a plain or an async function) until it returns something truthy, and
    return that; AssertionError naming `what` after `deadline_s` seconds (without `what`,
    the message names the check and where it is defined, enough for a lambda whose
    condition reads as the description)."""
    if not callable(check):
        raise TypeError(f"check must be a function to call, not {type(check).__name__}")
    if deadline_s <= 0 or interval_s <= 0:
        raise ValueError(f"deadline_s and interval_s must be positive, not {deadline_s} and {interval_s}")
    deadline = time.monotonic() + deadline_s
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {deadline_s} s waiting for {what or _describe(check)}")
        await asyncio.sleep(interval_s)


def eventually_sync(
    check: Callable[[], Any], what: str | None = None, deadline_s: float = 30.0, interval_s: float = 0.05
) -> Any:
    """`eventually` for code without an event loop (plain tests, the CLI's): blocks between polls."""
    if deadline_s <= 0 or interval_s <= 0:
        raise ValueError(f"deadline_s and interval_s must be positive, not {deadline_s} and {interval_s}")
    deadline = time.monotonic() + deadline_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {deadline_s} s waiting for {what or _describe(check)}")
        time.sleep(interval_s)


def _describe(check: Callable[..., object]) -> str:
    code = getattr(check, "__code__", None)
    name = getattr(check, "__qualname__", repr(check))
    if code is None:
        return name
    return f"{name} ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"
