"""Admission control: a bound on the HTTP requests a node works on at once.

Past the bound a request is answered at once with 503 `overloaded` and `Retry-After`, before
any of its work is done: it takes a slot once its token is checked and its body has arrived
(a client that trickles its body must not hold a slot meanwhile; the body read has its own
timeout and the connection cap bounds those), and before its body is decoded or its
handler runs. The answer is distinct from `not_active` (the node IS the active node, only
busy), so SDKs back off and retry on the same node instead of looking for another.

Probes (`/livez`, `/readyz`) are never shed: a load balancer that saw them fail would take
the active node out of service, the worst answer to load. Long-lived requests (Worker long
polls, SSE streams) do not take request slots either: they wait far more than they work, and
the cap on open connections bounds them (see RouteSpec.bounded). Event streams are counted
apart (StreamAdmission): a cap for the node (`max_streams`) and one per token
(`max_streams_per_token`), so that one client cannot hold every connection open.

A Worker's heartbeats and results (`/v1/worker/tasks/{token}/...`) are not counted either.
The node already chose how much Worker work to take on when it handed the attempts out, and
each attempt has at most one result and one heartbeat in flight, so the hand-outs bound them.
Shedding them would not lighten the load: the work is done, the Worker retries the same
report after its backoff, and meanwhile its slot runs nothing: with as many tasks running
as the bound, the results alone would fill it. A report with a token the node did not hand
out is answered 404 after one read, without waiting on anything.

Bodies are bounded by their bytes as well, on every route that takes one (Worker reports
included: one big result costs as much memory as any other big body). A body counts from
before it is read (its Content-Length, or its route's limit when it is sent chunked) until
its request is answered, since its decoded value lives as long. Past `max_body_bytes` the
request gets 503 `overloaded` and its body is never read, so a burst of big bodies holds at
most about that much memory (times what decoding a body costs), however many connections
send one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from dex_ha.server.errors import RETRY_AFTER_S, Overloaded

# Seconds a shed client should wait; the SDKs add jitter and cap their backoff.
OVERLOADED_RETRY_AFTER_S = RETRY_AFTER_S


class Admission:
    """Counts the bounded requests in flight; `try_enter` refuses past `limit`."""

    def __init__(self, limit: int, owner: str = "this node", max_body_bytes: int = 64 << 20) -> None:
        if limit < 1:
            raise ValueError("limit: must be at least 1")
        self.limit = limit
        self.max_body_bytes = max_body_bytes
        self.owner = owner  # who sheds, in the Overloaded message ("node n1")
        self.in_flight = 0
        self.body_bytes = 0  # of the bodies being read or worked on
        self.shed_total = 0

    def try_enter(self) -> bool:
        """Take a slot; False (and one more shed) when all `limit` slots are taken."""
        if self.in_flight >= self.limit:
            self.shed_total += 1
            return False
        self.in_flight += 1
        return True

    def leave(self) -> None:
        self.in_flight -= 1

    @contextmanager
    def slot(self, bounded: bool) -> Iterator[None]:
        """Hold a slot for the body of the block (none for an unbounded route); raises
        Overloaded when there is none free."""
        if not bounded:
            yield
            return
        if not self.try_enter():
            raise Overloaded(
                f"{self.owner} is at its bound of {self.limit} requests in flight; retry after {OVERLOADED_RETRY_AFTER_S} s"
            )
        try:
            yield
        finally:
            self.leave()

    @contextmanager
    def body(self, size: int) -> Iterator[None]:
        """Count a body of (at most) `size` bytes for the block; raises Overloaded, before the
        body is read, when it would take the bodies in flight past `max_body_bytes`."""
        if self.body_bytes + size > self.max_body_bytes:
            self.shed_total += 1
            raise Overloaded(
                f"{self.owner} holds {self.body_bytes} bytes of request bodies, and this one of {size} would take "
                f"it past its bound of {self.max_body_bytes} (max_inflight_body_bytes); "
                f"retry after {OVERLOADED_RETRY_AFTER_S} s"
            )
        self.body_bytes += size
        try:
            yield
        finally:
            self.body_bytes -= size


class StreamAdmission:
    """Counts the open SSE event streams, all of them and per token; `open` refuses a
    stream past `limit` for the node or `per_token_limit` for one token with 503
    `overloaded` naming the cap (a stream that waits for a free place would hold a
    connection meanwhile: the client retries after Retry-After instead)."""

    def __init__(self, limit: int, per_token_limit: int, owner: str = "this node") -> None:
        if limit < 1 or per_token_limit < 1:
            raise ValueError("limit, per_token_limit: must be at least 1")
        self.limit = limit
        self.per_token_limit = per_token_limit
        self.owner = owner
        self.open_total = 0
        self.shed_total = 0
        self._by_token: dict[bytes, int] = {}

    @contextmanager
    def open(self, token: bytes | None) -> Iterator[None]:
        """Hold a place for one stream while the block runs; `token` (a digest of the
        caller's token; None when the node has no tokens) counts against its own cap too.
        Raises Overloaded when either cap is reached."""
        self._check(token)
        self.open_total += 1
        if token is not None:
            self._by_token[token] = self._by_token.get(token, 0) + 1
        try:
            yield
        finally:
            self.open_total -= 1
            if token is not None:
                self._close_one(token)

    def _check(self, token: bytes | None) -> None:
        retry = f"close a stream or retry after {OVERLOADED_RETRY_AFTER_S} s"
        if self.open_total >= self.limit:
            self.shed_total += 1
            raise Overloaded(
                f"{self.owner} has {self.limit} event streams open, its cap max_streams = {self.limit}; {retry}"
            )
        if token is not None and self._by_token.get(token, 0) >= self.per_token_limit:
            self.shed_total += 1
            raise Overloaded(
                f"this token has {self.per_token_limit} event streams open on {self.owner}, "
                f"its cap max_streams_per_token = {self.per_token_limit}; {retry}"
            )

    def _close_one(self, token: bytes) -> None:
        left = self._by_token[token] - 1
        if left:
            self._by_token[token] = left
        else:
            del self._by_token[token]
