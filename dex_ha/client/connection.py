"""One way to reach the active node of a dex-ha cluster over HTTP (used by the Client and Worker SDKs).

Only the active node serves the API. Every other node answers 503
``{"error": "not_active", "leader_url": ...}`` with ``Retry-After``. A :class:`Connection`
hides that: it sends each request to the node it believes active and, when the answer
says otherwise or the node cannot be reached, it moves on and tries again.

Where it sends requests:

- ONE URL (a readiness-following address: HAProxy, a Kubernetes Service): always there;
  the address itself routes to whichever node is active.
- SEVERAL node URLs: a 503 that names ``leader_url`` moves the connection to that URL,
  even one missing from the list (the cluster knows its members better than the
  caller); a 503 without it, a 502/504, or a connection error rotates to the next URL
  of the list. A 503 ``overloaded`` (busy) or ``unavailable`` (a write not committed in
  time: too few nodes replicate) comes from the active node itself: the connection stays
  there and backs off (honouring ``Retry-After``).

When it waits: switching node is free for the first pass through the list (a dead node
costs no sleep); after that, and always with one URL, it backs off exponentially from
``backoff_initial_s`` to ``backoff_max_s`` with full jitter, and resets after a success.
A ``Retry-After`` header is honoured only up to the current backoff cap: a failover
takes well under a second, and the header counts whole seconds.

It never gives up on its own while the cluster has no active node (an election is
normal and short) unless ``give_up_after_s`` is set; then it raises
:class:`DexUnavailable`.

Retrying is safe because every API call is idempotent by design: a session and a
message carry ids chosen by the caller (a repeat is a no-op), repeating the same
approval or answer is a 200 no-op, and task results are fenced by step, attempt and
term (a result for an attempt that is no longer current gets 409 and changes nothing).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import SplitResult, urlsplit

import aiohttp

from dex_ha.client.env import split_urls

log = logging.getLogger("dex_ha.client")

# Answers that mean "not here / not now": the request may succeed on another node or later.
RETRYABLE_STATUSES = frozenset({502, 503, 504})
# The 503s of the active node itself, retried after Retry-After on the same node (another
# node would only send the request back), with what the SDK says while it retries them and
# when it gives up: one that sheds load, and a write it could not commit in time (it may
# still commit: sending it again with the same ids is safe).
OVERLOADED = "overloaded"
NOT_COMMITTED = "unavailable"
_ACTIVE_NODE_REFUSALS = {
    OVERLOADED: ("the active node is shedding load", "the active dex-ha node kept shedding load"),
    NOT_COMMITTED: (
        "the active node cannot commit writes in time (too few nodes replicate)",
        "the active dex-ha node kept failing to commit the write in time",
    ),
}
_NO_ACTIVE_NODE = ("no active node yet", "no active dex-ha node answered")
# How long a request must have been retrying before an operator is warned, and how often.
SLOW_RETRY_WARNING_S = 5.0

T = TypeVar("T")


class DexError(Exception):
    """An answer the caller must handle: any 4xx, or a 500.

    Attributes: ``status`` (HTTP status), ``code`` (the ``error`` field of the JSON body,
    or ``http_<status>`` when there is none), ``message`` (human text) and ``body`` (the
    decoded JSON body, or the raw text when it was not JSON).
    """

    def __init__(self, status: int, code: str, message: str, body: Any = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.body = body


class DexUnavailable(DexError):
    """No active node answered, or the active one kept answering ``overloaded``, within
    ``give_up_after_s``. Status 503, code ``unavailable``."""

    def __init__(self, message: str) -> None:
        super().__init__(503, "unavailable", message, None)


@dataclass
class _RetryableAnswer(Exception):
    """A 502/503/504 answer: try again, maybe on another node (internal to this module)."""

    status: int
    code: str
    message: str
    leader_url: str | None
    retry_after_s: float | None

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"


def _normalize_url(url: Any, argument: str) -> str:
    """Check that ``url`` is an absolute http(s) URL that can be requested; strip its trailing '/'.

    ValueError naming ``argument`` and the URL for anything a request could not be sent
    to (a bad port, spaces, a comma), so that a typo fails at once instead of being retried.
    """
    if not isinstance(url, str):
        raise TypeError(f"{argument} must be a URL string, got {type(url).__name__}")
    text = url.strip()
    parts = urlsplit(text)
    problem = None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        problem = "must be an http:// or https:// URL"
    elif any(c.isspace() for c in text) or "," in text:
        problem = "must be one URL (no spaces or commas)"
    elif not parts.hostname:
        problem = "has no host name"
    elif not _valid_port(parts):
        problem = "has a port that is not a number from 1 to 65535"
    if problem is not None:
        raise ValueError(f"{argument} {problem}, got {url!r}")
    return text.rstrip("/")


def _valid_port(parts: SplitResult) -> bool:
    try:
        port = parts.port  # ValueError for a port that is not a number, or above 65535
    except ValueError:
        return False
    return port is None or port >= 1


def _normalize_urls(urls: str | Sequence[str]) -> list[str]:
    """The URLs as a list; a string may hold several, comma-separated (as DEX_HA_URLS does)."""
    if isinstance(urls, str):
        urls = split_urls(urls) or [urls]
        if len(urls) == 1:
            return [_normalize_url(urls[0], "urls")]
    if not isinstance(urls, Sequence):
        raise TypeError(f"urls must be a URL string or a list of URL strings, got {type(urls).__name__}")
    if len(urls) == 0:
        raise ValueError("urls must not be empty: give one URL or a list of node URLs")
    return [_normalize_url(url, f"urls[{i}]") for i, url in enumerate(urls)]


def _parse_retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the HTTP-date form is ignored: nodes send seconds)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _decode_body(text: str) -> Any:
    """The JSON value of ``text``, None when empty, the text itself when it is not JSON."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


async def _answer_error(resp: aiohttp.ClientResponse) -> Exception:
    """Turn a non-2xx answer into the exception to raise: retryable or DexError."""
    text = await resp.text(errors="replace")
    body = _decode_body(text)
    fields = body if isinstance(body, dict) else {}
    code = str(fields.get("error") or f"http_{resp.status}")
    message = str(fields.get("message") or (text.strip()[:500] if text.strip() else resp.reason or ""))
    if resp.status in RETRYABLE_STATUSES:
        leader_url = fields.get("leader_url")
        return _RetryableAnswer(
            status=resp.status,
            code=code,
            message=message,
            leader_url=leader_url if isinstance(leader_url, str) and leader_url else None,
            retry_after_s=_parse_retry_after(resp.headers.get("Retry-After")),
        )
    return DexError(resp.status, code, message, body)


class Connection:
    """Sends requests to the active node of a cluster, following it across failovers.

    ``urls`` is one readiness-following URL or a list of node URLs (see the module
    docstring for how each is used). Every retried request is safe because every API
    call is idempotent by design (message ids, same decision, fenced task results).

    ``sleep`` and ``clock`` replace ``asyncio.sleep`` and ``time.monotonic``; tests use
    them to check the backoff without waiting.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        token: str | None = None,
        *,
        request_timeout_s: float = 30.0,
        give_up_after_s: float | None = None,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 2.0,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[Any]] | None = None,
        clock: Callable[[], float] | None = None,
        namespace: str | None = None,
    ) -> None:
        self._urls = _normalize_urls(urls)
        for name, value in (("token", token), ("namespace", namespace)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a string or None, got {type(value).__name__}")
            if value == "":
                raise ValueError(f"{name} must not be empty (pass None for none)")
        if request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0, got {request_timeout_s}")
        if give_up_after_s is not None and give_up_after_s < 0:
            raise ValueError(f"give_up_after_s must be >= 0 or None, got {give_up_after_s}")
        if backoff_initial_s <= 0:
            raise ValueError(f"backoff_initial_s must be > 0, got {backoff_initial_s}")
        if backoff_max_s < backoff_initial_s:
            raise ValueError(f"backoff_max_s must be >= backoff_initial_s, got {backoff_max_s} < {backoff_initial_s}")
        self._token = token
        self._namespace = namespace  # sent as Dex-Namespace; None: the server's default
        self._request_timeout_s = request_timeout_s
        self._give_up_after_s = give_up_after_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._rng = rng if rng is not None else random.Random()
        self._sleep = sleep if sleep is not None else asyncio.sleep
        self._clock = clock if clock is not None else time.monotonic
        # Where requests go now. With several URLs it may be a leader_url outside the list;
        # _list_index remembers where rotation continues from.
        self._current_url = self._urls[0]
        self._list_index = 0
        # Failed tries since the last success: sets the backoff cap.
        self._failures = 0
        self._last_slow_warning_at: float | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def current_url(self) -> str:
        """The node URL (or the single URL) that the next request goes to."""
        return self._current_url

    @property
    def urls(self) -> list[str]:
        """The URLs this connection was given, normalized."""
        return list(self._urls)

    # ----------------------------------------------------------------- public calls

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """Send one API call to the active node and return the JSON body of its 2xx answer.

        Returns None for an empty body. Raises :class:`DexError` for a 4xx or 500 (not
        retried: the same request would get the same answer). Retries with backoff on
        connection errors (refused, reset, DNS), request timeouts and 502/503/504,
        following the active node; this is safe because every API call is idempotent
        (message ids, same decision, fenced task results). ``timeout_s`` overrides
        ``request_timeout_s`` for this call (a long-poll needs more than its wait).
        """
        _check_path(path)
        # Every POST, PUT and DELETE says it sends JSON, an empty body included: the nodes
        # refuse other requests that change things (415), so that no web page can send them.
        headers = self._headers(json_body=body is not None or method != "GET")
        data = json.dumps(body) if body is not None else None
        timeout = aiohttp.ClientTimeout(total=timeout_s if timeout_s is not None else self._request_timeout_s)

        async def send_once(session: aiohttp.ClientSession, base_url: str) -> Any:
            async with session.request(
                method, base_url + path, data=data, params=params, headers=headers, timeout=timeout
            ) as resp:
                if 200 <= resp.status < 300:
                    return _decode_body(await resp.text(errors="replace"))
                raise await _answer_error(resp)

        return await self._with_retries(f"{method} {path}", send_once)

    async def open_stream(self, path: str, headers: dict[str, str] | None = None) -> aiohttp.ClientResponse:
        """Open a GET whose body the caller reads incrementally (SSE), on the active node.

        Follows the active node and retries like :meth:`request` until a 2xx answer
        arrives; the caller reads and then closes the returned response. There is no
        total or read timeout here (an event stream lasts as long as it is read; the
        reader applies its own idle timeout, see `sse.read_events`); the connect timeout
        still applies.
        """
        _check_path(path)
        all_headers = self._headers(json_body=False)
        all_headers.update(headers or {})
        timeout = aiohttp.ClientTimeout(
            total=None, sock_read=None, sock_connect=self._request_timeout_s, connect=self._request_timeout_s
        )

        async def open_once(session: aiohttp.ClientSession, base_url: str) -> aiohttp.ClientResponse:
            resp = await session.get(base_url + path, headers=all_headers, timeout=timeout)
            if 200 <= resp.status < 300:
                return resp
            try:
                raise await _answer_error(resp)
            finally:
                resp.release()

        return await self._with_retries(f"GET {path} (stream)", open_once)

    async def open_websocket(
        self, path: str, params: dict[str, str], *, heartbeat_s: float | None = None, protocols: Sequence[str] = ()
    ) -> aiohttp.ClientWebSocketResponse:
        """Open a WebSocket on the active node, following it and retrying as
        :meth:`request` does; a refused upgrade raises what the same request without the
        upgrade is answered (a 404 from a node that has no such route, a 401, ...).
        ``heartbeat_s``: ping this often; no pong within half of it closes the socket."""
        _check_path(path)
        headers = self._headers(json_body=False)
        timeout = aiohttp.ClientWSTimeout(ws_close=self._request_timeout_s)

        async def open_once(session: aiohttp.ClientSession, base_url: str) -> aiohttp.ClientWebSocketResponse:
            try:
                return await session.ws_connect(
                    base_url + path,
                    params=params,
                    headers=headers,
                    heartbeat=heartbeat_s,
                    protocols=tuple(protocols),
                    timeout=timeout,
                    max_msg_size=0,  # the node bounds what it sends; a Worker takes what it is handed
                    compress=0,  # frames are small and many: deflate would cost more than it saves
                )
            except aiohttp.WSServerHandshakeError:
                # The handshake error carries no body: ask again without the upgrade, whose
                # answer names the reason (and the active node's URL, for a 503 not_active).
                plain = aiohttp.ClientTimeout(total=self._request_timeout_s)
                async with session.get(base_url + path, params=params, headers=headers, timeout=plain) as resp:
                    raise await _answer_error(resp) from None

        return await self._with_retries(f"GET {path} (WebSocket)", open_once)

    async def close(self) -> None:
        """Close the HTTP session. The connection opens a new one if used again."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ----------------------------------------------------------------- retry loop

    async def _with_retries(self, what: str, send_once: Callable[[aiohttp.ClientSession, str], Awaitable[T]]) -> T:
        """Call ``send_once(session, base_url)`` until it succeeds or raises a DexError."""
        started = self._clock()
        # Moving to another node is free (no sleep) for one pass through the list.
        free_switches = len(self._urls) - 1
        while True:
            base_url = self._current_url
            retry_after_s: float | None = None
            try:
                result = await send_once(self._get_session(), base_url)
            except _RetryableAnswer as answer:
                last_error = f"{base_url} answered {answer}"
                why = _ACTIVE_NODE_REFUSALS.get(answer.code, _NO_ACTIVE_NODE)
                retry_after_s = answer.retry_after_s
                self._move_after_answer(base_url, answer)
            except aiohttp.InvalidURL as exc:  # no retry can mend a URL (leader_url is checked, too)
                raise ValueError(f"{what}: {base_url} is not a URL a request can be sent to ({exc})") from None
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                last_error = f"{base_url}: {type(exc).__name__}" + (f": {exc}" if str(exc) else "")
                why = _NO_ACTIVE_NODE
                self._rotate(base_url, f"cannot reach it ({type(exc).__name__})")
            else:
                self._failures = 0
                return result
            # A concurrent request may have moved the connection too: any new node counts.
            switched = self._current_url != base_url
            waited = self._clock() - started
            self._give_up_if_too_long(what, waited, last_error, why[1])
            self._warn_if_slow(what, waited, last_error, why[0])
            if switched and free_switches > 0:
                free_switches -= 1
                continue
            await self._back_off(retry_after_s, waited)

    def _move_after_answer(self, base_url: str, answer: _RetryableAnswer) -> None:
        """Pick the node for the next try after a retryable answer from ``base_url``."""
        if len(self._urls) == 1 or self._current_url != base_url:
            return  # one URL: stay; or a concurrent request already moved on
        if answer.code in _ACTIVE_NODE_REFUSALS:
            return  # the active node itself answered: another node would only send us back
        if answer.leader_url is not None:
            try:
                leader_url = _normalize_url(answer.leader_url, "leader_url")
            except (TypeError, ValueError):
                log.warning("dex-ha node %s sent an unusable leader_url %r", base_url, answer.leader_url)
            else:
                if leader_url != base_url:
                    self._switch_to(leader_url, f"{base_url} is not active and names the leader")
                # else: it is the leader but not ready yet (takeover running): wait for it.
                return
        self._rotate(base_url, f"it answered {answer.status} {answer.code}")

    def _rotate(self, base_url: str, reason: str) -> None:
        """Move from ``base_url`` to the next URL of the list (several URLs only)."""
        if len(self._urls) == 1 or self._current_url != base_url:
            return
        next_url = self._urls[(self._list_index + 1) % len(self._urls)]
        self._switch_to(next_url, f"{base_url}: {reason}")

    def _switch_to(self, url: str, reason: str) -> None:
        log.info("dex-ha client: switching to %s (%s)", url, reason)
        self._current_url = url
        if url in self._urls:
            self._list_index = self._urls.index(url)

    def _give_up_if_too_long(self, what: str, waited: float, last_error: str, why: str) -> None:
        if self._give_up_after_s is not None and waited >= self._give_up_after_s:
            raise DexUnavailable(
                f"{what}: {why} after trying for {waited:.1f} s "
                f"(give_up_after_s={self._give_up_after_s}) on {', '.join(self._urls)}; "
                f"last error: {last_error}"
            )

    def _warn_if_slow(self, what: str, waited: float, last_error: str, why: str) -> None:
        """Tell the operator, at most once per 5 s, that requests keep failing, and why: no
        node is active, or the active one sheds load (`overloaded`) or cannot commit
        (`unavailable`)."""
        if waited <= SLOW_RETRY_WARNING_S:
            return
        now = self._clock()
        if self._last_slow_warning_at is not None and now - self._last_slow_warning_at < SLOW_RETRY_WARNING_S:
            return
        self._last_slow_warning_at = now
        log.warning(
            "dex-ha client: %s still retrying after %.1f s, %s; last error: %s",
            what,
            waited,
            why,
            last_error,
        )

    def retry_delay(self, failures: int) -> float:
        """The wait after ``failures`` failures in a row (0 for the first): full jitter,
        uniform(0, cap), under a cap that doubles from backoff_initial_s to backoff_max_s."""
        cap = self._backoff_cap(failures)
        return self._rng.uniform(0.0, cap)

    async def sleep_before_retry(self, failures: int) -> None:
        """Sleep :meth:`retry_delay` (for callers with their own retry loop, e.g. a stream)."""
        await self._sleep(self.retry_delay(failures))

    def _backoff_cap(self, failures: int) -> float:
        return min(self._backoff_max_s, self._backoff_initial_s * 2.0 ** min(max(failures, 0), 60))

    def _next_backoff_delay(self, retry_after_s: float | None) -> float:
        """The wait before the next try of a request; counts one more failure.

        ``Retry-After`` can lengthen the wait, but never beyond the current cap.
        """
        cap = self._backoff_cap(self._failures)
        delay = self.retry_delay(self._failures)
        self._failures += 1
        if retry_after_s is not None:
            delay = min(max(delay, retry_after_s), cap)
        return delay

    async def _back_off(self, retry_after_s: float | None, waited: float) -> None:
        delay = self._next_backoff_delay(retry_after_s)
        if self._give_up_after_s is not None:
            delay = min(delay, max(0.0, self._give_up_after_s - waited))
        await self._sleep(delay)

    # ----------------------------------------------------------------- plumbing

    def _get_session(self) -> aiohttp.ClientSession:
        # Created lazily so that it belongs to the running event loop.
        if self._session is None or self._session.closed:
            # No pool limit: a Worker keeps a long poll, heartbeats and results in flight
            # for every running task; a queue for a pooled connection would delay them all.
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self._session

    def _headers(self, *, json_body: bool) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        if self._namespace is not None:
            headers["Dex-Namespace"] = self._namespace
        if json_body:
            headers["Content-Type"] = "application/json"
        return headers


def _check_path(path: str) -> None:
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"path must start with '/', got {path!r}")
