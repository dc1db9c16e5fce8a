"""DexClient: an async client for every client route of the dex-ha HTTP API.

Every call goes through a :class:`~dex_ha.client.connection.Connection`, which follows
the active node across failovers and retries. Retrying is safe because each call is
idempotent: the client picks the session id and the message id itself (when the caller
does not), so a call retried after a failover never makes two sessions or starts two
turns; repeating the same approval, answer, cancel or reconcile is a no-op.

Example::

    async with DexClient(["http://n1:8801", "http://n2:8801"], token="...") as client:
        session = await client.create_session("support-bot")
        await client.send_message(session.session_id, "Hello")
        snapshot = await client.wait_until_idle(session.session_id)
        print(snapshot.status, snapshot.history[-1])

The session calls return typed results (dex_ha/client/results.py says which, and why);
each keeps the JSON the server sent in ``.raw``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any, Literal
from urllib.parse import quote

import aiohttp

from dex_ha.client.connection import Connection
from dex_ha.client.env import CLIENT_TOKEN_VAR, TOKEN_VAR, namespace_from_env, token_from_env, urls_from_env
from dex_ha.client.results import (
    ClusterView,
    MessageAccepted,
    Session,
    SessionPage,
    SessionSummary,
    acknowledgement,
)
from dex_ha.client.sse import RawEvent, read_events
from dex_ha.session_protocol import EventType, SessionEvent

log = logging.getLogger("dex_ha.client")

MESSAGE_MODES = ("queue", "steer")
RECONCILE_OUTCOMES = ("succeeded", "failed")
# wait_until_idle re-reads the snapshot this often (growing from the first to the last).
IDLE_POLL_FIRST_S = 0.05
IDLE_POLL_MAX_S = 0.5


class IdleTimeoutError(asyncio.TimeoutError):
    """wait_until_idle's deadline passed. ``session_id`` and ``last_status`` say where it stood."""

    def __init__(self, session_id: str, last_status: str | None, timeout_s: float) -> None:
        super().__init__(f"session {session_id!r} is not idle after {timeout_s} s (last status: {last_status!r})")
        self.session_id = session_id
        self.last_status = last_status


def _segment(value: Any, argument: str) -> str:
    """An id checked and quoted for use as one path segment."""
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a string, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{argument} must not be empty")
    return quote(value, safe="")


def _optional_str(value: Any, argument: str) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{argument} must be a string or None, got {type(value).__name__}")


def _optional_bool(value: Any, argument: str) -> None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{argument} must be a bool or None, got {type(value).__name__}")


def _query_value(value: str | int | bool) -> str:
    """A query parameter's text: booleans as the API spells them (true, false)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class DexClient:
    """Async client of the dex-ha client API. Use ``async with`` or call :meth:`close`.

    ``urls`` and ``token`` and the keyword arguments go to :class:`Connection`
    (``give_up_after_s``, ``request_timeout_s``, backoff settings). ``urls`` is one URL, a
    list, or a comma-separated string. Left out (None), they come from the environment
    that ``tokens.env`` of ``dex-ha cluster up`` sets: ``urls`` from ``DEX_HA_URLS``
    (else http://127.0.0.1:8801, where ``dex-ha dev`` listens) and ``token`` from
    ``DEX_HA_CLIENT_TOKEN``, else ``DEX_HA_TOKEN`` (else no token).

    ``namespace``: the namespace whose sessions this client works with (every request
    names it); left out, ``DEX_HA_NAMESPACE``, else none is named and the server uses
    ``default`` (or the only namespace of a token limited to one).
    """

    def __init__(
        self,
        urls: str | Sequence[str] | None = None,
        token: str | None = None,
        *,
        namespace: str | None = None,
        **connection_kwargs: Any,
    ) -> None:
        if urls is None:
            urls = urls_from_env()
        if token is None:
            token = token_from_env(CLIENT_TOKEN_VAR, TOKEN_VAR)
        if namespace is None:
            namespace = namespace_from_env()
        self._conn = Connection(urls, token, namespace=namespace, **connection_kwargs)

    @property
    def connection(self) -> Connection:
        """The connection this client sends through (its current_url shows the active node)."""
        return self._conn

    # ----------------------------------------------------------------- sessions

    async def create_session(
        self, agent: str, session_id: str | None = None, metadata: dict[str, Any] | None = None
    ) -> Session:
        """Create a session of ``agent`` (or get it, when ``session_id`` already exists for that agent).

        The session id is chosen here when not given, so a retry after a failover finds
        the session the first try made instead of making a second one.
        """
        _segment(agent, "agent")
        if session_id is None:
            session_id = "s-" + uuid.uuid4().hex
        _segment(session_id, "session_id")
        if metadata is not None and not isinstance(metadata, dict):
            raise TypeError(f"metadata must be a dict or None, got {type(metadata).__name__}")
        body: dict[str, Any] = {"agent": agent, "session_id": session_id}
        if metadata is not None:
            body["metadata"] = metadata
        return Session.from_answer(await self._conn.request("POST", "/v1/sessions", body))

    async def get_session(self, session_id: str) -> Session:
        """The agent snapshot of a session: status, turns, history, tool calls, pending waits."""
        return Session.from_answer(
            await self._conn.request("GET", f"/v1/sessions/{_segment(session_id, 'session_id')}")
        )

    async def list_sessions(
        self,
        agent: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        after: str | None = None,
        awaiting_approval: bool | None = None,
        outcome_unknown: bool | None = None,
    ) -> SessionPage:
        """One page of sessions, newest first (the server's order). Pass ``page.next_after``
        as ``after`` for the next page; None means no more pages.

        Filters (None: no filter): ``agent``, ``status`` (``idle`` or ``running``),
        ``awaiting_approval`` (True: only sessions with a tool call waiting for approval;
        False: only those without) and ``outcome_unknown`` (True: only sessions with an
        outcome_unknown tool call to reconcile; False: only those without).
        """
        _optional_str(agent, "agent")
        _optional_str(status, "status")
        _optional_str(after, "after")
        _optional_bool(awaiting_approval, "awaiting_approval")
        _optional_bool(outcome_unknown, "outcome_unknown")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0):
            raise ValueError(f"limit must be a positive int or None, got {limit!r}")
        params = {
            name: _query_value(value)
            for name, value in (
                ("agent", agent),
                ("status", status),
                ("limit", limit),
                ("after", after),
                ("awaiting_approval", awaiting_approval),
                ("outcome_unknown", outcome_unknown),
            )
            if value is not None
        }
        return SessionPage.from_answer(await self._conn.request("GET", "/v1/sessions", params=params))

    async def iter_sessions(
        self,
        agent: str | None = None,
        status: str | None = None,
        page_size: int = 100,
        awaiting_approval: bool | None = None,
        outcome_unknown: bool | None = None,
    ) -> AsyncIterator[SessionSummary]:
        """Every session matching the filters (those of :meth:`list_sessions`), page after page."""
        after: str | None = None
        while True:
            page = await self.list_sessions(
                agent=agent,
                status=status,
                limit=page_size,
                after=after,
                awaiting_approval=awaiting_approval,
                outcome_unknown=outcome_unknown,
            )
            for session in page.sessions:
                yield session
            if not page.next_after or page.next_after == after:
                return  # the last page (or a server that would loop forever)
            after = page.next_after

    # ----------------------------------------------------------------- turns

    async def send_message(
        self, session_id: str, text: str, message_id: str | None = None, mode: str = "queue"
    ) -> MessageAccepted:
        """Send a user message; returns the 202 answer (the message id it was recorded under).

        The message id is chosen here when not given: a retry after a failover repeats
        the same id, which the server treats as a no-op, so it never starts a second turn.
        ``mode="steer"`` delivers the message at the running turn's next model call.
        """
        sid = _segment(session_id, "session_id")
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, got {type(text).__name__}")
        if mode not in MESSAGE_MODES:
            raise ValueError(f"mode must be one of {MESSAGE_MODES}, got {mode!r}")
        if message_id is None:
            message_id = uuid.uuid4().hex
        _segment(message_id, "message_id")
        body = {"text": text, "message_id": message_id, "mode": mode}
        return MessageAccepted.from_answer(await self._conn.request("POST", f"/v1/sessions/{sid}/messages", body))

    async def approve(
        self, session_id: str, call_id: str, approved: bool = True, reason: str | None = None
    ) -> dict[str, Any]:
        """Decide a tool call that waits for approval (the same decision again is a no-op)."""
        sid = _segment(session_id, "session_id")
        cid = _segment(call_id, "call_id")
        if not isinstance(approved, bool):
            raise TypeError(f"approved must be a bool, got {type(approved).__name__}")
        _optional_str(reason, "reason")
        body: dict[str, Any] = {"approved": approved}
        if reason is not None:
            body["reason"] = reason
        return acknowledgement(await self._conn.request("POST", f"/v1/sessions/{sid}/approvals/{cid}", body))

    async def deny(self, session_id: str, call_id: str, reason: str | None = None) -> dict[str, Any]:
        """Refuse a tool call that waits for approval; the call records ``failed`` with the reason."""
        return await self.approve(session_id, call_id, approved=False, reason=reason)

    async def answer(self, session_id: str, question_id: str, answer: Any) -> dict[str, Any]:
        """Answer a pending question (asked by the model or by a tool)."""
        sid = _segment(session_id, "session_id")
        qid = _segment(question_id, "question_id")
        return acknowledgement(
            await self._conn.request("POST", f"/v1/sessions/{sid}/questions/{qid}/answer", {"answer": answer})
        )

    async def cancel(self, session_id: str, reason: str | None = None) -> dict[str, Any]:
        """Cancel the running turn of a session; `cancelled` in the answer is the turn's id,
        or None when no turn was running."""
        sid = _segment(session_id, "session_id")
        body = {} if reason is None else {"reason": reason}
        return acknowledgement(await self._conn.request("POST", f"/v1/sessions/{sid}/cancel", body))

    async def delete(self, session_id: str) -> dict[str, Any]:
        """Delete an ended session and everything of it. A session with a running turn is
        refused (:class:`DexError` 409: cancel it first); one that does not exist, or was
        deleted already, is 404 (also a retry whose first try was deleted, but its answer
        lost)."""
        sid = _segment(session_id, "session_id")
        return acknowledgement(await self._conn.request("DELETE", f"/v1/sessions/{sid}"))

    async def reconcile(
        self,
        session_id: str,
        call_id: str,
        outcome: Literal["succeeded", "failed"],
        result: Any = None,
        error: str | None = None,
    ) -> dict[str, Any]:
        """Settle a tool call whose outcome is unknown, after checking what really happened."""
        sid = _segment(session_id, "session_id")
        cid = _segment(call_id, "call_id")
        if outcome not in RECONCILE_OUTCOMES:
            raise ValueError(f"outcome must be one of {RECONCILE_OUTCOMES}, got {outcome!r}")
        _optional_str(error, "error")
        body: dict[str, Any] = {"outcome": outcome}
        if result is not None:
            body["result"] = result
        if error is not None:
            body["error"] = error
        return acknowledgement(await self._conn.request("POST", f"/v1/sessions/{sid}/tool-calls/{cid}/reconcile", body))

    # ----------------------------------------------------------------- cluster

    async def cluster(self) -> ClusterView:
        """The cluster view of the node the connection is on (any node answers this)."""
        return ClusterView.from_answer(await self._conn.request("GET", "/v1/cluster"))

    # ----------------------------------------------------------------- events

    def events(self, session_id: str, after: str | None = None) -> AsyncGenerator[SessionEvent, None]:
        """The session's events, committed ones after ``after`` and live deltas, without end.

        When the stream ends or the connection drops (the node died, a failover), it
        reconnects through the Connection (leader following, backoff), resumes after the
        last committed event seen (``Last-Event-ID``) and never yields an event twice.
        It stops when the caller stops iterating (``break`` or ``aclose()``), after a
        ``session_deleted`` event (the session was deleted), or with a :class:`DexError`
        when the server refuses the stream (404: no such session).
        """
        sid = _segment(session_id, "session_id")
        _optional_str(after, "after")
        return self._follow_events(sid, after)

    async def _follow_events(self, quoted_sid: str, after: str | None) -> AsyncGenerator[SessionEvent, None]:
        last_id = after
        empty_streams = 0  # streams in a row that ended without an event: backs off reconnects
        path = f"/v1/sessions/{quoted_sid}/events"
        while True:
            headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
            if last_id is not None:
                headers["Last-Event-ID"] = last_id
            resp = await self._conn.open_stream(path, headers)
            got_event = False
            try:
                async for raw in read_events(resp):
                    got_event = True
                    event = _decode_event(raw)
                    if event is None:
                        continue
                    if event.id is not None:
                        if last_id is not None and not _is_newer(event.id, last_id):
                            continue  # already yielded before a reconnect
                        last_id = event.id
                    yield event
                    if event.type == EventType.SESSION_DELETED:
                        return  # the server's last word: the session is gone
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                log.info("dex-ha client: event stream of %s dropped (%s); reconnecting", path, exc)
            finally:
                resp.close()
            empty_streams = 0 if got_event else empty_streams + 1
            if empty_streams:
                await self._conn.sleep_before_retry(empty_streams - 1)

    # ----------------------------------------------------------------- waiting

    async def wait_until_idle(self, session_id: str, timeout_s: float = 60.0) -> Session:
        """Wait until the session is idle with no waiting messages; return that snapshot.

        Re-reads the snapshot on a short, growing interval (the snapshot is the truth;
        nothing here depends on the event stream). Raises :class:`IdleTimeoutError` (an
        ``asyncio.TimeoutError``) naming the session and its last status at the deadline.
        """
        _segment(session_id, "session_id")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        interval = IDLE_POLL_FIRST_S
        last_status: str | None = None
        while True:
            remaining = deadline - loop.time()
            try:
                async with asyncio.timeout(max(remaining, 0.001)):  # not wait_for: see sse.read_events
                    snapshot = await self.get_session(session_id)
            except TimeoutError:
                raise IdleTimeoutError(session_id, last_status, timeout_s) from None
            last_status = snapshot.status
            if snapshot.is_idle:
                return snapshot
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise IdleTimeoutError(session_id, last_status, timeout_s)
            await asyncio.sleep(min(interval, remaining))
            interval = min(interval * 1.5, IDLE_POLL_MAX_S)

    # ----------------------------------------------------------------- lifetime

    async def close(self) -> None:
        """Close the HTTP session."""
        await self._conn.close()

    async def __aenter__(self) -> DexClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _decode_event(raw: RawEvent) -> SessionEvent | None:
    """A SessionEvent from a wire event, or None (logged) when its data is not a JSON object."""
    try:
        payload = json.loads(raw.data)
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        log.warning("dex-ha client: skipping an event whose data is not a JSON object: %.200r", raw.data)
        return None
    return SessionEvent.from_json(raw.id, raw.event, payload)


def _is_newer(event_id: str, last_id: str) -> bool:
    """Whether ``event_id`` comes after ``last_id``. Ids are decimal strings that grow."""
    if event_id.isdigit() and last_id.isdigit():
        return int(event_id) > int(last_id)
    return event_id != last_id  # not decimal: only an exact repeat is known to be a duplicate
