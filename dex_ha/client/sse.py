"""A Server-Sent Events parser (the text/event-stream format of the WHATWG HTML spec).

Fed raw bytes as they arrive, it returns each complete event. It does its own line
splitting (instead of ``StreamReader.readline``) so that one event is never limited by
the reader's buffer size, and it accepts ``\\n``, ``\\r\\n`` and ``\\r`` line ends.

Only what dex-ha uses is kept: ``id``, ``event`` and ``data`` fields; comment lines
(``:`` keep-alives) and ``retry`` are ignored. Unlike a browser, an event's ``id`` is
the id on that event only (a delta without an ``id:`` line has id None), because a
client must tell committed events from live deltas.
"""

from __future__ import annotations

import asyncio
import codecs
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp

# SSE line ends only (str.splitlines would also split on U+2028 and friends inside data).
_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class RawEvent:
    """One event as it came over the wire: its fields, not yet decoded as JSON."""

    id: str | None
    event: str
    data: str


@dataclass
class SSEParser:
    """Turns a byte stream into :class:`RawEvent` s; keeps partial lines between feeds."""

    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )
    _pending: str = ""  # text after the last complete line
    _id: str | None = None
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _has_fields: bool = False

    def feed(self, chunk: bytes) -> list[RawEvent]:
        """Add bytes; return the events they complete, in order."""
        text = self._pending + self._decoder.decode(chunk)
        events: list[RawEvent] = []
        start = 0
        for line_end in _LINE_END.finditer(text):
            if line_end.group() == "\r" and line_end.end() == len(text):
                break  # may be the first half of "\r\n": wait for the next chunk
            event = self._line(text[start : line_end.start()])
            start = line_end.end()
            if event is not None:
                events.append(event)
        self._pending = text[start:]
        return events

    def _line(self, line: str) -> RawEvent | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment: keep-alive
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:  # the spec ignores ids with NUL
                self._id = value
        else:
            return None  # retry or an unknown field
        self._has_fields = True
        return None

    def _dispatch(self) -> RawEvent | None:
        if not self._has_fields:
            return None
        event = RawEvent(id=self._id, event=self._event or "message", data="\n".join(self._data))
        self._id, self._event, self._data, self._has_fields = None, "", [], False
        # The spec drops an event without data; a committed event always has data.
        return event if event.data or event.id is not None else None


# The server sends a keep-alive comment every 15 s: three missed ones mean the stream is dead.
STREAM_IDLE_TIMEOUT_S = 45.0


async def read_events(
    resp: aiohttp.ClientResponse, idle_timeout_s: float = STREAM_IDLE_TIMEOUT_S
) -> AsyncIterator[RawEvent]:
    """Yield the events of an open event-stream response until it ends.

    A connection that drops mid-stream raises an aiohttp.ClientError, and one that sees no
    byte for `idle_timeout_s` raises TimeoutError: a node that vanished without closing
    the connection (a partition, a dead host) must not hang the reader. The caller
    reconnects. An event cut off by the end of the stream is not yielded.
    """
    parser = SSEParser()
    while True:
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
        # races with the read finishing, and the reader would then never stop.
        async with asyncio.timeout(idle_timeout_s):
            chunk = await resp.content.readany()
        if not chunk:
            return
        for event in parser.feed(chunk):
            yield event
