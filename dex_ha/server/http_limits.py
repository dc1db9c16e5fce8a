"""Limits on HTTP connections: slow and broken clients must not hold the node's descriptors,
and must never make `/livez` or `/readyz` fail.

- **Read timeouts.** A request's headers must arrive within `http_header_timeout_ms` of the
  connect (or, on a keep-alive connection, of the first byte of the next request); its body
  within `http_body_timeout_ms` once the handler reads it (408 `request_timeout`). Between
  requests, aiohttp closes a keep-alive connection idle for `http_keepalive_timeout_ms`.
  The timeouts cover reading the request only: once a request is read, its answer takes as
  long as it takes (a Worker long poll, an SSE event stream).
- **A cap on open connections** (`http_max_connections`; by default what the open-files limit
  allows after `FD_HEADROOM` descriptors for the Raft transport, SQLite and logs, and those of
  the probe listener, which has a small cap of its own: `PROBE_LISTENER_LIMITS`). Above the
  cap a connection lands in a small reserve (`PROBE_RESERVE`) that serves one `/livez` or
  `/readyz` request and closes; any other request there gets 503 `overloaded`. When the
  reserve is full too, a new connection replaces the reserve connection that has waited
  longest for its request (probes send theirs at once, slow sockets do not), or is closed
  at once. So API clients hold at most `max_connections + PROBE_RESERVE + ACCEPT_BATCH`
  descriptors, and a probe (it sends its request at once) is answered however many slow
  clients there are.
- **Clients that go away** (body cut short, reset) are answered 499, as nginx does: counted in
  `dex_http_requests_total{code="499"}` (an operator sees clients that give up), logged at
  debug level, never a 5xx.

aiohttp has no header-read timeout, and the event loop's server accepts connections in
batches (asyncio: up to `backlog` at a time) with no say over which to keep: under a flood the
process runs out of descriptors before any can be closed, accept fails (EMFILE), and the probes
fail with it. So `GuardedSite` accepts the connections itself, one at a time, and wraps each
aiohttp `RequestHandler` in a `_Connection` that watches its bytes and requests (the handler
sees every call unchanged).
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from dex_ha.server.admission import OVERLOADED_RETRY_AFTER_S
from dex_ha.server.errors import HttpError
from dex_ha.server.metrics import ServerMetrics
from dex_ha.server.validation import BodyTooLarge

if TYPE_CHECKING:
    from dex_ha.server.config import ServerConfig

log = logging.getLogger("dex_ha.server.http")

PROBE_PATHS = frozenset({"/livez", "/readyz"})
# Connections above the cap that may serve a probe: kubelet and HAProxy checks each hold one
# for a few milliseconds, so a few dozen cover many probers.
PROBE_RESERVE = 32
# A probe sends its request at once; a reserve connection that has not after this is not one.
PROBE_HEADER_TIMEOUT_S = 2.0
# Descriptors kept for everything but HTTP clients: the Raft transport (peers, learners),
# SQLite (database, WAL, shared memory), the Raft log, stdio, the event loop.
FD_HEADROOM = 128
# The derived default stops here: each connection costs memory too, and HAProxy (maxconn
# 4096 in deploy/) funnels its clients into far fewer.
MAX_CONNECTIONS_CEILING = 10_000
# Below this a node cannot serve its Workers and clients; the open-files limit is too low.
MIN_CONNECTIONS = 16
# Connections accepted per wake-up of the listening socket. Closing one (over the cap)
# releases its descriptor only at the next loop iteration, so this bounds the extra.
ACCEPT_BATCH = 16
# After accept fails (out of descriptors or memory), wait this long before trying again.
ACCEPT_RETRY_S = 0.1
# nginx's "client closed request": the client went away before it had its answer.
CLIENT_CLOSED_REQUEST = 499
# Every answer's Server header: the product, never its version or aiohttp's (which would
# tell an attacker which known flaws to try).
SERVER_NAME = "dex-ha"

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class HttpLimits:
    header_timeout_s: float
    body_timeout_s: float
    keepalive_timeout_s: float
    max_connections: int
    reserve: int = PROBE_RESERVE

    @classmethod
    def from_config(cls, config: ServerConfig, open_files: int | None = None) -> HttpLimits:
        """The API port's limits; `open_files` is the soft RLIMIT_NOFILE (read when None)."""
        if open_files is None:
            open_files = open_files_limit()
        if config.probe_listen is not None:
            open_files -= PROBE_LISTENER_LIMITS.descriptors()
        allowed = max_connections_allowed(open_files)
        wanted = config.http_max_connections or min(allowed, MAX_CONNECTIONS_CEILING)
        if wanted > allowed:
            log.warning(
                "http_max_connections = %d is more than the open-files limit allows; using %d "
                "(raise the limit: ulimit -n, LimitNOFILE=)",
                wanted,
                allowed,
            )
        return cls(
            header_timeout_s=config.http_header_timeout_ms / 1000,
            body_timeout_s=config.http_body_timeout_ms / 1000,
            keepalive_timeout_s=config.http_keepalive_timeout_ms / 1000,
            max_connections=min(wanted, allowed),
        )

    @property
    def reserve_header_timeout_s(self) -> float:
        return min(self.header_timeout_s, PROBE_HEADER_TIMEOUT_S)

    def handler_args(self) -> dict[str, Any]:
        """Arguments for aiohttp's RequestHandler (through AppRunner)."""
        return {"keepalive_timeout": self.keepalive_timeout_s}

    def descriptors(self) -> int:
        """The most descriptors that clients of a site with these limits can hold."""
        return self.max_connections + self.reserve + ACCEPT_BATCH

    def describe(self) -> str:
        reserve = f" (+{self.reserve} for /livez and /readyz)" if self.reserve else ""
        return (
            f"at most {self.max_connections} connections{reserve}, request headers within "
            f"{self.header_timeout_s:g} s, a body within {self.body_timeout_s:g} s, "
            f"idle keep-alive {self.keepalive_timeout_s:g} s"
        )


# The probe listener (probes.py): kubelets and balancers open a connection per check and send
# their request at once. Its cap bounds the descriptors that clients of that port can take.
PROBE_LISTENER_LIMITS = HttpLimits(
    header_timeout_s=PROBE_HEADER_TIMEOUT_S,
    body_timeout_s=PROBE_HEADER_TIMEOUT_S,
    keepalive_timeout_s=PROBE_HEADER_TIMEOUT_S,
    max_connections=64,
    reserve=0,
)


def open_files_limit() -> int:
    """The soft RLIMIT_NOFILE (process.py raises it to the hard limit at start)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft  # unlimited: MAX_CONNECTIONS_CEILING applies


def max_connections_allowed(open_files: int) -> int:
    """The most API connections that leave FD_HEADROOM of `open_files` descriptors to the rest."""
    allowed = open_files - FD_HEADROOM - PROBE_RESERVE - ACCEPT_BATCH
    if allowed < MIN_CONNECTIONS:
        log.warning(
            "the open-files limit (%d) is too low for a node: HTTP clients may take the descriptors "
            "that Raft and SQLite need; raise it to at least %d",
            open_files,
            MIN_CONNECTIONS + FD_HEADROOM + PROBE_RESERVE + ACCEPT_BATCH,
        )
        return MIN_CONNECTIONS
    return allowed


# ---------------------------------------------------------------- answering


async def name_the_server(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """An app's on_response_prepare signal: the Server header says SERVER_NAME only."""
    response.headers["Server"] = SERVER_NAME


# ---------------------------------------------------------------- reading the request


class BodyTimeout(HttpError):
    """The request body did not arrive in time: 408 `request_timeout`."""

    def __init__(self, message: str) -> None:
        super().__init__(408, "request_timeout", message)


async def read_body(request: web.Request, timeout_s: float, max_bytes: int) -> bytes:
    """The whole request body; BodyTimeout after `timeout_s`, and BodyTooLarge as soon as
    more than `max_bytes` arrived (a chunked body has no Content-Length to refuse it by, and
    a compressed one is counted as it inflates), so no more than that is ever held."""
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            while chunk := await request.content.readany():
                size += len(chunk)
                if size > max_bytes:
                    raise BodyTooLarge(max_bytes)
                chunks.append(chunk)
    except TimeoutError:
        raise BodyTimeout(f"body: did not arrive within {timeout_s:g} s") from None
    return b"".join(chunks)


def client_gone(request: web.BaseRequest, exc: ConnectionError) -> web.Response:
    """The answer to a request whose client went away (its connection is closed or reset).

    The handlers open no connections of their own (Raft errors arrive as NotLeader or
    ProposalDropped), so a ConnectionError is the client's. Nobody reads this answer: its
    status is what the request is counted as.
    """
    log.debug("%s %s: the client went away before its answer (%s)", request.method, request.path, exc)
    return web.Response(status=CLIENT_CLOSED_REQUEST)


# ---------------------------------------------------------------- connections


class GuardedSite(web.BaseSite):
    """An aiohttp site on a listening socket whose connections a ConnectionGuard accepts.
    `metrics` (the API port's) counts them; None for the probe listener."""

    def __init__(
        self, runner: web.BaseRunner, sock: socket.socket, limits: HttpLimits, metrics: ServerMetrics | None
    ) -> None:
        super().__init__(runner)
        self._sock = sock
        self._guard = ConnectionGuard(limits, metrics)

    @property
    def name(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    async def start(self) -> None:
        await super().start()
        assert self._runner.server is not None, "runner.setup() comes first"
        self._guard.start(self._sock, self._runner.server)
        log.info("%s: %s", self.name, self._guard.limits.describe())

    async def stop(self) -> None:
        self._guard.stop()
        await super().stop()


class ConnectionGuard:
    """Accepts a node's HTTP connections and keeps them within its HttpLimits."""

    def __init__(self, limits: HttpLimits, metrics: ServerMetrics | None) -> None:
        self.limits = limits
        self._metrics = metrics
        self._regular: set[_Connection] = set()
        self._reserve: dict[_Connection, None] = {}  # in arrival order: the oldest is evicted first
        self._connecting: set[asyncio.Task[Any]] = set()
        self._listener: socket.socket | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._accept_failed = False  # log an accept error once, not once per wake-up

    def start(self, listener: socket.socket, server: web.Server) -> None:
        """Accept on `listener`; aiohttp's `server` makes the handler of each connection."""
        self._loop = asyncio.get_running_loop()
        self._listener = listener
        self._server = server
        # Every request passes through _dispatch first: it tells the connection that its
        # request arrived, and answers from the reserve.
        self._app_handler: Handler = server.request_handler
        server.request_handler = self._dispatch
        if self._metrics is not None:
            self._metrics.http_connections_max.set(self.limits.max_connections)
        self._loop.add_reader(listener.fileno(), self._accept)

    def stop(self) -> None:
        """Stop accepting (the open connections are aiohttp's to close)."""
        if self._listener is None:
            return
        if self._retry is not None:
            self._retry.cancel()
        self._loop.remove_reader(self._listener.fileno())
        self._listener = None
        for task in self._connecting:
            task.cancel()

    # ------------------------------------------------------------ accepting

    def _accept(self) -> None:
        assert self._listener is not None
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # the client gave up while it waited in the queue
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS, ENOMEM
                self._pause_accepting(exc)
                return
            self._accept_failed = False
            self._admit(sock)

    def _pause_accepting(self, exc: OSError) -> None:
        # The socket stays readable: without a pause we would spin. Connections wait in the
        # kernel's queue meanwhile.
        if not self._accept_failed:
            log.warning("cannot accept HTTP connections (%s); retrying every %g s", exc, ACCEPT_RETRY_S)
        self._accept_failed = True
        self._reject("accept_error")
        assert self._listener is not None
        self._loop.remove_reader(self._listener.fileno())
        self._retry = self._loop.call_later(ACCEPT_RETRY_S, self._resume_accepting)

    def _resume_accepting(self) -> None:
        self._retry = None
        if self._listener is not None:
            self._loop.add_reader(self._listener.fileno(), self._accept)

    def _admit(self, sock: socket.socket) -> None:
        in_reserve = len(self._regular) >= self.limits.max_connections
        if in_reserve and len(self._reserve) >= self.limits.reserve and not self._evict_from_reserve():
            sock.close()  # every reserve connection is being answered: no room at all
            self._reject("over_capacity")
            return
        sock.setblocking(False)
        conn = _Connection(self, self._server(), in_reserve=in_reserve)
        if in_reserve:
            self._reserve[conn] = None
        else:
            self._regular.add(conn)
        self._count_open(+1)
        task = self._loop.create_task(self._loop.connect_accepted_socket(lambda: conn, sock))
        self._connecting.add(task)
        task.add_done_callback(partial(self._connected, conn, sock))

    def _connected(self, conn: _Connection, sock: socket.socket, task: asyncio.Task[Any]) -> None:
        self._connecting.discard(task)
        if task.cancelled() or task.exception() is not None:
            sock.close()
            self.forget(conn)

    def _evict_from_reserve(self) -> bool:
        """Close the oldest reserve connection not being answered: it had its chance."""
        for conn in self._reserve:
            if not conn.busy:
                self.forget(conn)
                conn.close()
                self._reject("over_capacity")
                return True
        return False

    def forget(self, conn: _Connection) -> None:
        """`conn` is closed (or closing): its place is free. Safe to call twice."""
        if conn in self._regular or conn in self._reserve:
            self._regular.discard(conn)
            self._reserve.pop(conn, None)
            self._count_open(-1)

    def headers_late(self, conn: _Connection) -> None:
        log.debug("closing an HTTP connection: no complete request within the header timeout")
        self._reject("header_timeout")
        self.forget(conn)
        conn.close()

    def _count_open(self, change: int) -> None:
        if self._metrics is not None:
            self._metrics.http_connections_open.inc(change)

    def _reject(self, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.http_connections_rejected.labels(reason=reason).inc()

    # ------------------------------------------------------------ requests

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        transport = request.transport
        conn = transport.get_protocol() if transport is not None else None
        if not isinstance(conn, _Connection):  # the client left before its request came up
            return await self._app_handler(request)
        conn.request_started(request)
        try:
            if conn.in_reserve:
                return await self._answer_from_reserve(request)
            return await self._app_handler(request)
        finally:
            conn.request_finished()

    async def _answer_from_reserve(self, request: web.BaseRequest) -> web.StreamResponse:
        """A probe is answered; anything else is told to come back. Either way the
        connection closes after this one answer, so its place in the reserve is free."""
        if request.path in PROBE_PATHS:
            response = await self._app_handler(request)
        else:
            self._reject("over_capacity")
            response = self._overloaded()
        response.force_close()
        return response

    def _overloaded(self) -> web.Response:
        body = {
            "error": "overloaded",
            "message": f"the node has {self.limits.max_connections} HTTP connections open, its limit; "
            "retry later (only /livez and /readyz are answered now)",
        }
        return web.json_response(
            body,
            status=503,
            headers={"Retry-After": OVERLOADED_RETRY_AFTER_S, "Server": SERVER_NAME},
            dumps=partial(json.dumps, separators=(",", ":")),
        )


class _Connection(asyncio.Protocol):
    """One HTTP connection: aiohttp's RequestHandler does the work, this watches the time.

    While no request is being answered and one is due (the connection is new, or the first
    bytes of the next request came), a deadline runs: the header timeout. A request being
    answered has none. Between requests (keep-alive) nothing runs here either: aiohttp closes
    an idle connection after its keepalive_timeout.
    """

    def __init__(self, guard: ConnectionGuard, handler: RequestHandler, *, in_reserve: bool) -> None:
        self._guard = guard
        self._handler = handler
        self.in_reserve = in_reserve
        self.busy = False  # a request is being answered
        self._closed = False
        self._handler_connected = False
        self._request: web.BaseRequest | None = None  # the latest request, to tell its body from the next request
        self._next_request_begun = False
        self._deadline: asyncio.TimerHandle | None = None

    # asyncio.Protocol: the transport's calls go on to aiohttp's handler unchanged.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._closed:  # evicted from the reserve while it was being connected
            transport.close()
            return
        self._handler.connection_made(transport)
        self._handler_connected = True
        self._expect_request()

    def data_received(self, data: bytes) -> None:
        if self._body_complete():  # so these bytes begin (or continue) the next request
            if self.busy:
                self._next_request_begun = True  # pipelined: due once this answer is done
            elif self._deadline is None:
                self._expect_request()
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        self._handler.eof_received()
        return None  # as aiohttp's handler: the transport closes itself

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._closed = True
        self._cancel_deadline()
        self._request = None
        self._guard.forget(self)
        if self._handler_connected:
            self._handler.connection_lost(exc)

    # Called by the guard.

    def request_started(self, request: web.BaseRequest) -> None:
        self._cancel_deadline()
        self.busy = True
        self._request = request
        self._next_request_begun = False

    def request_finished(self) -> None:
        self.busy = False
        if self._next_request_begun:
            self._expect_request()

    def close(self) -> None:
        self._closed = True
        self._cancel_deadline()
        self._handler.force_close()

    # The deadline.

    def _expect_request(self) -> None:
        if self._closed:
            return
        limits = self._guard.limits
        timeout = limits.reserve_header_timeout_s if self.in_reserve else limits.header_timeout_s
        self._deadline = asyncio.get_running_loop().call_later(timeout, self._headers_late)

    def _headers_late(self) -> None:
        self._deadline = None
        self._guard.headers_late(self)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _body_complete(self) -> bool:
        """Has the latest request's body arrived (all of it)? Bytes after it are the next request."""
        return self._request is None or self._request.content.is_eof()


__all__ = [
    "BodyTimeout",
    "CLIENT_CLOSED_REQUEST",
    "GuardedSite",
    "HttpLimits",
    "PROBE_LISTENER_LIMITS",
    "SERVER_NAME",
    "client_gone",
    "name_the_server",
    "read_body",
]
