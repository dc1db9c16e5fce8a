"""Giving freed memory back to the system after big request bodies.

glibc's malloc keeps what a process frees for its next allocations: after a burst of big
bodies (each read, decoded and dropped) a node's resident memory stays near the burst's
peak, though Python holds none of it. `malloc_trim(0)` returns the free pages at the top
of each heap and the free whole pages inside them. It runs on a thread (ctypes releases the
interpreter lock during the call), once the last big body in flight is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable
from functools import partial

# A body this big or bigger leaves memory worth giving back once it is done.
TRIM_AFTER_BODY_BYTES = 1 << 20


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's malloc_trim(0), or None where there is none (musl, macOS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return partial(trim, 0)


class MemoryReleaser:
    """`body_done(size, still_in_flight)` after each request body: once no body is in flight
    after a big one, malloc_trim runs on a thread (one at a time)."""

    def __init__(self) -> None:
        self._trim = _malloc_trim()
        self._due = False
        self._running: asyncio.Future[object] | None = None

    def body_done(self, size: int, still_in_flight: int) -> None:
        self._due = self._due or size >= TRIM_AFTER_BODY_BYTES
        if not self._due or still_in_flight or self._trim is None:
            return
        if self._running is not None and not self._running.done():
            return  # the one running now frees this body's memory too, or the next one will
        self._due = False
        self._running = asyncio.get_running_loop().run_in_executor(None, self._trim)
