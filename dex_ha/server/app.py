"""The HTTP API: one handler per route of `api_spec.ROUTES`, bound by name.

Every request first passes the browser checks (`_browser_checks`, browsers.py: Host and
Origin), then goes through the same pipeline (`_handle`): token → Content-Type → active
node? → size and JSON → path, query, header and body validation → handler → JSON answer. Handlers get the
validated arguments and return `(status, body)` or a response; errors are raised as
HttpErrors (errors.py) that the pipeline turns into `{"error", "message"}` answers, so no
handler writes an error response of its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

import dex_ha
from dex_ha.engine import (
    AnswerQuestion,
    ApplyResult,
    AttemptState,
    CancelTurn,
    CompleteAttempt,
    CreateSession,
    DecideApproval,
    DeleteSession,
    EngineReader,
    FailAttempt,
    Proposal,
    ReconcileToolCall,
    RegisterAgent,
    ReportResults,
    SendMessage,
)
from dex_ha.engine.statuses import AttemptStatus
from dex_ha.raft.errors import ConfChangeRefused
from dex_ha.server.api_spec import FIELD_CAP_CEILINGS, NAMESPACE, NAMESPACE_HEADER, ROUTES, RouteSpec
from dex_ha.server.auth import NODE_CALLER, Caller, TokenAuth, token_digest
from dex_ha.server.backup import BackupNotPossible, backup_bytes, take_backup
from dex_ha.server.browsers import BrowserGuard, check_content_type
from dex_ha.server.channel import WorkerChannel
from dex_ha.server.cluster_nodes import every_node_view
from dex_ha.server.config import ConfigError, ServerConfig, parse_address
from dex_ha.server.console import add_console_routes
from dex_ha.server.errors import RAFT_ERRORS, ApiError, HttpError, NotActive, NotServing, from_raft
from dex_ha.server.forwarding import forward, wants_forwarding
from dex_ha.server.http_limits import SERVER_NAME, client_gone, name_the_server, read_body
from dex_ha.server.leader import LeaderTerm
from dex_ha.server.memory import MemoryReleaser
from dex_ha.server.node_credential import NODE_ROUTES
from dex_ha.server.openapi import openapi_document
from dex_ha.server.task_tokens import TaskToken, new_token_secret
from dex_ha.server.validation import (
    BodyTooLarge,
    InvalidRequest,
    check_field_sizes,
    decode_json_body,
    validate_body,
    validate_headers,
    validate_path,
    validate_query,
)
from dex_ha.session_protocol import SessionDeleted, SessionSnapshot

if TYPE_CHECKING:  # node.py builds the app: importing it here at run time would be a circle
    from dex_ha.server.node import NodeServer

log = logging.getLogger("dex_ha.server.http")
V = TypeVar("V")  # the value type of a proposed command (Proposal[V])

# The handlers' argument that holds the request's Caller (auth.py); no route has an input
# of this name (a name with a space cannot be one).
CALLER = "the caller"
SSE_KEEPALIVE_S = 15.0
# A channel frame may hold one result of max_result_bytes and this much besides.
CHANNEL_FRAME_MARGIN_BYTES = 1 << 20
# How long closing a channel waits for the Worker's answer to the close frame.
CHANNEL_CLOSE_TIMEOUT_S = 1.0
SSE_EVENTS_PER_READ = 500

Answer = tuple[int, Any] | web.StreamResponse
Handler = Callable[["Api", dict[str, Any], web.Request], Awaitable[Answer]]


@dataclass
class Api:
    """The handlers' view of the node."""

    node: NodeServer
    openapi: dict[str, Any]
    memory: MemoryReleaser = field(default_factory=MemoryReleaser)

    @property
    def engine(self) -> EngineReader:
        """The state, read-only (changes go through `propose`)."""
        return self.node.replica.reads

    async def propose(self, cmd: Proposal[V]) -> ApplyResult[V]:
        """A client's write: answered 503 `unavailable` (NotCommitted) when it has not
        committed within proposal_timeout_ms, rather than left hanging. An accepted
        command's result carries its typed value (`ApplyResult[V]` for a `Proposal[V]`);
        a refused one raises ApiError with its status and code."""
        result = await self.node.propose(cmd, timeout_ms=self.node.config.proposal_timeout_ms)
        if not result.ok:
            raise ApiError(result.http_status, result.code, result.reason)
        return result


def still_active(api: Api) -> LeaderTerm:
    """Check again, just before answering from this node's state after a wait (a long
    poll, a copy on a thread, an SSE stream's wait), that this node is still the active
    node. The pipeline checks when the request comes in; a lease that lapsed meanwhile
    (the Raft loop stalled, the network cut this node off) means another node may serve
    newer state by now. Raises NotServing: 503 not_active, as the entry check does.

    Answers that rest on a commit (a proposal's result) need no second check: the commit
    itself proves the leadership."""
    return api.node.serving()


def build_app(node: NodeServer) -> web.Application:
    auth = TokenAuth(node.config.tokens, node.config.scoped_tokens)
    api = Api(node, openapi_document(version=dex_ha.__version__))
    # Bodies are read by read_body (http_limits.py) with their route's limit; aiohttp's own
    # cap (client_max_size, for request.read()) is the largest of them, should anything call it.
    config = node.config
    guard = BrowserGuard.for_node(config.http_listen[0], config.url, config.allowed_hosts, config.allowed_origins)
    app = web.Application(
        client_max_size=max(r.max_body_bytes for r in ROUTES) + 1,
        middlewares=[_browser_checks(guard), _json_http_errors],
    )
    app.on_response_prepare.append(name_the_server)
    app.on_response_prepare.append(partial(_cors_headers, guard))
    for route in ROUTES:
        app.router.add_route(route.method, route.path, _pipeline(api, auth, route, HANDLERS[route.name]))
    add_console_routes(app)  # the web console's page and files (no token: the page asks for one)
    return app


def _browser_checks(guard: BrowserGuard) -> Middleware:
    """Every request, the console's and unknown paths' included, passes the Host and Origin
    checks (browsers.py) first; a CORS preflight from an allowed origin is answered here."""

    @web.middleware
    async def check(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            guard.check(request)
        except HttpError as exc:
            return _error_answer(None, exc)
        return guard.preflight(request) or await handler(request)

    return check


async def _cors_headers(guard: BrowserGuard, request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(guard.cors_headers(request.headers.get("Origin")))


def _pipeline(
    api: Api, auth: TokenAuth, route: RouteSpec, handler: Handler
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            response = await _handle(api, auth, route, handler, request)
        except HttpError as exc:  # every error answer, in one shape (errors.py)
            response = _error_answer(api.node, exc)
        except ConnectionError as exc:  # the client went away: 499, not a server error
            response = client_gone(request, exc)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s %s failed", route.method, request.path)
            response = _error(500, "internal", "the server failed to answer; see its log")
        api.node.metrics.count_request(route.name, response.status)
        if route.body is not None:  # the body and its decoded value are gone now: give big ones back
            api.memory.body_done(_declared_body_size(route, request), api.node.admission.body_bytes)
        return response

    return handle


async def _handle(
    api: Api, auth: TokenAuth, route: RouteSpec, handler: Handler, request: web.Request
) -> web.StreamResponse:
    caller = _authenticate(api, auth, route, request.headers.get("Authorization"))
    check_content_type(route.method, request.headers.get("Content-Type"))
    if route.active_only:
        try:
            api.node.serving()  # raises NotServing: 503 with leader_url
        except NotServing as not_active:
            if not wants_forwarding(route.name, request):
                raise
            return await _forward_to_active(api, route, request, not_active)
    args = {
        **validate_path(route, request.match_info),
        **validate_query(route, request.query),
        **validate_headers(route, request.headers),
    }
    args[CALLER] = caller
    if NAMESPACE in route.headers:  # 403 if the token may not use it
        args["namespace"] = caller.namespace(args.pop(NAMESPACE_HEADER))
    # The body counts in admission from before it is read until the answer (its decoded
    # value lives as long): past the bytes in flight, 503 `overloaded` and it is never read.
    with api.node.admission.body(_body_size(route, request)):
        raw = await _read_body(api, route, request) if route.body is not None else None
        with api.node.admission.slot(route.bounded):  # raises Overloaded: 503 at once
            if raw is not None:
                args.update(validate_body(route, decode_json_body(route, raw)))
                check_field_sizes(route, args, _field_caps(api.node.config))
            try:
                answer = await handler(api, args, request)
            except RAFT_ERRORS as exc:  # a proposal or membership change that Raft refused
                raise from_raft(exc) from exc
    if isinstance(answer, web.StreamResponse):
        return answer
    status, body = answer
    return web.json_response(body, status=status, dumps=_dumps)


async def _forward_to_active(
    api: Api, route: RouteSpec, request: web.Request, not_active: NotServing
) -> web.StreamResponse:
    """The console's call, passed on to the active node (forwarding.py); `not_active`, this
    node's own 503, when it knows no other node to pass it to."""
    leader_url = api.node.redirect_url()
    if leader_url is None:
        raise not_active
    with api.node.admission.body(_body_size(route, request)):
        raw = await _read_body(api, route, request) if route.body is not None else None
        return await forward(request, raw, leader_url)


def _body_size(route: RouteSpec, request: web.Request) -> int:
    """The most bytes the request's body can take (`_declared_body_size`); 413 `too_large`
    for a Content-Length over the route's limit, before any of the body is read."""
    size = _declared_body_size(route, request)
    if size > route.max_body_bytes:
        raise BodyTooLarge(route.max_body_bytes, size)
    return size


def _declared_body_size(route: RouteSpec, request: web.Request) -> int:
    """0 for a route that reads no body, its Content-Length, or the route's limit for a
    chunked body (read_body stops there)."""
    if route.body is None:
        return 0
    if request.content_length is None:
        return route.max_body_bytes if request.body_exists else 0
    return request.content_length


def _field_caps(config: ServerConfig) -> dict[str, int]:
    """The values of the settings that FieldSpec.max_bytes names."""
    return {name: getattr(config, name) for name in FIELD_CAP_CEILINGS}


def _authenticate(api: Api, auth: TokenAuth, route: RouteSpec, authorization: str | None) -> Caller:
    """The caller's token (auth.py), or on the routes another node calls, the cluster's own
    credential (node_credential.py: a caller of no namespace); raises AuthError otherwise."""
    if route.name in NODE_ROUTES and api.node.node_credential.accepts(authorization, time.time()):
        return NODE_CALLER
    return auth.caller(authorization, route)


async def _read_body(api: Api, route: RouteSpec, request: web.Request) -> bytes:
    try:
        return await read_body(request, api.node.config.http_body_timeout_ms / 1000, route.max_body_bytes)
    except web.RequestPayloadError:  # e.g. a gzip or deflate body that does not inflate
        raise InvalidRequest("body", "cannot be read: its Content-Encoding does not decode") from None


# An answer that may be big is encoded and sent in pieces of about this many characters.
JSON_PIECE_CHARS = 1 << 20


async def _stream_json(request: web.Request, value: Any, status: int = 200) -> web.StreamResponse:
    """A JSON answer that may be big (a session's snapshot with its whole history, a page of
    sessions), encoded and written in pieces: each encoder call covers one member or one
    list item (whose size the caps on fields bound), and the interpreter lock is free
    between them, so the Raft thread runs however big the answer. A whole answer encoded
    in one call held the lock for as long as it took (1.8 s for 150 MB)."""
    response = web.StreamResponse(status=status, headers={"Content-Type": "application/json; charset=utf-8"})
    await response.prepare(request)
    pending: list[str] = []
    size = 0
    for piece in _json_pieces(value):
        pending.append(piece)
        size += len(piece)
        if size >= JSON_PIECE_CHARS:
            await response.write("".join(pending).encode())
            pending, size = [], 0
    await response.write("".join(pending).encode())
    await response.write_eof()
    return response


def _json_pieces(value: Any) -> Iterator[str]:
    """`value` as JSON text in pieces: an object member by member, and a list (the value or
    a member's) item by item; whatever lies deeper is one piece."""
    if isinstance(value, dict):
        yield "{"
        for i, (key, member) in enumerate(value.items()):
            yield f"{',' if i else ''}{_dumps(str(key))}:"
            yield from _list_pieces(member) if isinstance(member, list) else (_dumps(member),)
        yield "}"
    elif isinstance(value, list):
        yield from _list_pieces(value)
    else:
        yield _dumps(value)


def _list_pieces(items: list[Any]) -> Iterator[str]:
    yield "["
    for i, item in enumerate(items):
        yield f"{',' if i else ''}{_dumps(item)}"
    yield "]"


def _stdlib_dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _orjson_dumps_or_none() -> Callable[[Any], str] | None:
    """orjson, when installed, encodes the answers: ~15x faster than the stdlib for the
    task a Worker gets with every result (measured: 17 vs 266 us for a 2 KB answer, a few
    percent of the node's CPU per step). Answers only, never the engine's canonical JSON,
    which stays the stdlib's so it is byte-identical on every node."""
    try:
        import orjson
    except ImportError:
        return None

    def dumps(value: Any) -> str:
        try:
            return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
        except orjson.JSONEncodeError:  # what orjson refuses (an int past 64 bits): the stdlib
            return _stdlib_dumps(value)

    return dumps


_dumps: Callable[[Any], str] = _orjson_dumps_or_none() or _stdlib_dumps


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None, **extra: Any) -> web.Response:
    return _error_answer(None, HttpError(status, code, message, headers, **extra))


def _error_answer(node: NodeServer | None, error: HttpError) -> web.Response:
    """The JSON answer to an error. A not-active answer names the node to go to instead."""
    body = error.body()
    if isinstance(error, NotActive) and node is not None:
        body["leader_url"] = node.redirect_url()
    return web.json_response(body, status=error.status, headers=error.headers or None, dumps=_dumps)


# ---------------------------------------------------------------- every error in JSON
#
# The pipeline answers the errors of our routes. Two kinds of error happen outside it:
# aiohttp's router answers unknown paths (404) and wrong methods (405) by raising
# HTTPException, which the middleware turns into JSON; and aiohttp's connection handler
# answers requests it cannot parse (a bad Content-Length, over-long headers or request
# line, a bad method) itself, from RequestHandler.handle_error, which ApiRunner's
# connections override.


@web.middleware
async def _json_http_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(
            exc.status,
            _code_for_status(exc.status),
            _routing_message(request, exc),
            headers={"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None,
        )


def _routing_message(request: web.Request, exc: web.HTTPException) -> str:
    path = request.path if len(request.path) <= 200 else request.path[:200] + "..."
    if exc.status == 404:
        return f"no route {request.method} {path} (the routes are in /openapi.json)"
    if exc.status == 405:
        return f"{path} does not take {request.method}; it takes {exc.headers.get('Allow', 'no method')}"
    return f"{request.method} {path}: {exc.reason}"


def _code_for_status(status: int) -> str:
    """The error code of an answer that aiohttp, not a route, decided on."""
    known = {400: "invalid", 404: "not_found", 413: "too_large", 500: "internal"}
    return known.get(status) or HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")


class _JsonErrorsRequestHandler(RequestHandler):
    """aiohttp's connection handler, answering the requests it cannot parse in JSON."""

    __slots__ = ()

    def handle_error(
        self, request: BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs; raises if an answer was already sent
        # aiohttp's message quotes the bytes it choked on over several lines; the first says what.
        what = (message or HTTPStatus(status).phrase).strip().splitlines()[0].rstrip(":")
        response = _error(
            status,
            _code_for_status(status),
            f"the HTTP request is malformed: {what}" if status < 500 else "the server failed to answer; see its log",
        )
        response.force_close()  # as aiohttp does: the connection's framing cannot be trusted
        response.headers["Server"] = SERVER_NAME  # no app signal runs for a request that did not parse
        return response


class _JsonErrorsServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _JsonErrorsRequestHandler(self, loop=self._loop, **self._kwargs)


class ApiRunner(web.AppRunner):
    """web.AppRunner whose connections answer requests aiohttp cannot parse in JSON too."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return _JsonErrorsServer(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            **server._kwargs,
        )


async def openapi(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    return 200, api.openapi


# ---------------------------------------------------------------- operations


async def livez(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    return 200, api.node.liveness()


async def readyz(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    readiness = api.node.readiness()
    return readiness.http_status, readiness.body()


async def metrics(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    body = api.node.metrics.render_cached()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def cluster(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    return 200, await api.node.cluster_view()


async def cluster_nodes(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    return 200, await every_node_view(api.node)


async def step_down(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    return 200, await api.node.step_down(args.get("to"), args.get("drain_timeout_ms"))


async def add_member(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    try:
        raft_addr = parse_address(args["raft_addr"], "raft_addr")
    except ConfigError as exc:
        raise InvalidRequest("raft_addr", str(exc)) from None
    await _membership(api.node.membership.add_member(args["id"], raft_addr, args["url"]))
    return 200, {"id": args["id"], "voter": False, **await _members(api)}


async def promote_member(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    await _known_member(api, args["member_id"])
    await _membership(api.node.membership.promote_member(args["member_id"]))
    return 200, {"id": args["member_id"], "voter": True, **await _members(api)}


async def remove_member(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    await _known_member(api, args["member_id"])
    await _membership(api.node.membership.remove_member(args["member_id"]))
    return 200, {"id": args["member_id"], "removed": True, **await _members(api)}


async def _known_member(api: Api, member_id: str) -> None:
    if not await api.node.membership.is_member(member_id):
        raise ApiError(404, "not_found", f"no member {member_id!r} in the cluster")


async def _members(api: Api) -> dict[str, Any]:
    return {"members": await api.node.membership.members()}


async def _membership(change: Awaitable[None]) -> None:
    try:
        await change
    except ConfChangeRefused as exc:  # nothing changed (a learner not caught up: MemberNotCaughtUp, 409 too)
        raise ApiError(409, "conflict", str(exc)) from None


# ---------------------------------------------------------------- sessions


async def create_session(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    result = await api.propose(
        CreateSession(
            at=api.node.clock.now_ms(),
            agent=args["agent"],
            session_id=args.get("session_id"),
            metadata=args.get("metadata"),
            namespace=args["namespace"],
        )
    )
    created = result.accepted_value()
    return (201 if created.created else 200), api.engine.get_agent_snapshot(created.session_id)


async def list_sessions(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    newest_first = args["order"] == "newest"
    cursor = args.get("after")
    metadata = args.get("metadata")
    page = api.engine.sessions_page(
        args.get("agent"),
        args.get("status"),
        args["limit"],
        None if newest_first else cursor,
        awaiting_approval=args.get("awaiting_approval"),
        outcome_unknown=args.get("outcome_unknown"),
        namespace=args["namespace"],
        max_bytes=api.node.config.page_max_bytes,
        id_contains=args.get("id_contains"),
        metadata=None if metadata is None else _key_and_value(metadata),
        older_than=_newest_first_cursor(cursor) if newest_first and cursor else None,
        newest_first=newest_first,
    )
    sessions = page.items
    next_after = _sessions_cursor(sessions[-1], newest_first) if page.more else None
    return await _stream_json(request, {"sessions": sessions, "next_after": next_after})


def _sessions_cursor(last: dict[str, Any], newest_first: bool) -> str:
    """Where the next page of sessions starts: after the last session's id, or, newest first,
    after its creation time and id (a time alone would not do: several sessions may share it)."""
    return f"{last['created_at']}:{last['session_id']}" if newest_first else last["session_id"]


def _key_and_value(key_is_value: str) -> tuple[str, str]:
    key, _, value = key_is_value.partition("=")
    return key, value


def _newest_first_cursor(cursor: str) -> tuple[int, str]:
    created_at, _, session_id = cursor.partition(":")
    if not (created_at.isascii() and created_at.isdigit() and session_id):
        raise InvalidRequest("after", "is not a cursor of order=newest: pass the next_after of the previous page")
    return int(created_at), session_id


async def get_session(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    # A snapshot holds the session's whole history: it is streamed in pieces (see _stream_json).
    return await _stream_json(request, _snapshot(api, args["session_id"], args["namespace"]))


def _snapshot(api: Api, session_id: str, namespace: str) -> SessionSnapshot:
    """The session's snapshot; 404 when it does not exist or belongs to another namespace
    (the same answer: a caller must not learn that it exists)."""
    snapshot = api.engine.get_agent_snapshot(session_id)
    if snapshot is None or snapshot["namespace"] != namespace:
        raise ApiError(404, "not_found", f"no session {session_id!r} in namespace {namespace!r}")
    return snapshot


async def send_message(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    result = await api.propose(
        SendMessage(
            at=api.node.clock.now_ms(),
            session_id=args["session_id"],
            text=args["text"],
            message_id=args.get("message_id"),
            mode=args["mode"],
            namespace=args["namespace"],
        )
    )
    sent = result.accepted_value()
    return 202, {"session_id": args["session_id"], "message_id": sent.message_id, "duplicate": sent.duplicate}


async def decide_approval(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    result = await api.propose(
        DecideApproval(
            at=api.node.clock.now_ms(),
            session_id=args["session_id"],
            call_id=args["call_id"],
            approved=args["approved"],
            reason=args.get("reason"),
            namespace=args["namespace"],
        )
    )
    decided = result.accepted_value()
    return 200, {"call_id": decided.call_id, "approved": decided.approved, "noop": result.noop}


async def answer_question(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    result = await api.propose(
        AnswerQuestion(
            at=api.node.clock.now_ms(),
            session_id=args["session_id"],
            question_id=args["question_id"],
            answer=args["answer"],
            namespace=args["namespace"],
        )
    )
    return 200, {"question_id": result.accepted_value().question_id, "noop": result.noop}


async def cancel_turn(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    result = await api.propose(
        CancelTurn(
            at=api.node.clock.now_ms(),
            session_id=args["session_id"],
            reason=args.get("reason"),
            namespace=args["namespace"],
        )
    )
    return 200, {"session_id": args["session_id"], "cancelled": result.accepted_value().cancelled}


async def delete_session(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    result = await api.propose(
        DeleteSession(at=api.node.clock.now_ms(), session_id=args["session_id"], namespace=args["namespace"])
    )
    return 200, {"session_id": result.accepted_value().session_id, "deleted": True}


async def reconcile_tool_call(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    result = await api.propose(
        ReconcileToolCall(
            at=api.node.clock.now_ms(),
            session_id=args["session_id"],
            call_id=args["call_id"],
            outcome=args["outcome"],
            result=args.get("result"),
            error=args.get("error"),
            namespace=args["namespace"],
        )
    )
    reconciled = result.accepted_value()
    return 200, {"call_id": reconciled.call_id, "status": reconciled.status, "noop": result.noop}


async def session_events(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    """SSE: committed events from `after` (or Last-Event-ID) on, then live ones and deltas.

    The stream ends when this node stops being the active node; the client resumes from
    the last id it saw on whichever node is active then. It also ends, after an event
    `session_deleted`, once the session is deleted.
    """
    session_id = args["session_id"]
    _snapshot(api, session_id, args["namespace"])  # 404 before the stream starts
    after_text = args.get("Last-Event-ID") or args.get("after")
    after = int(after_text) if after_text else 0
    token = token_digest(request.headers.get("Authorization")) if api.node.config.auth_enabled else None
    with api.node.streams.open(token):  # raises Overloaded past max_streams or max_streams_per_token
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        await response.prepare(request)
        await _stream_events(api, response, session_id, after)
    return response


async def _stream_events(api: Api, response: web.StreamResponse, session_id: str, after: int) -> None:
    """Write the session's events from `after` on, and then each as it commits, until this
    node stops serving or the client goes away. A commit wakes the stream only when it added
    events to this session (Replica.session_waiters); a delta wakes it through the relay."""
    wake = asyncio.Event()
    waiters = api.node.replica.session_waiters
    waiters.add(session_id, wake)
    deltas = api.node.relay.subscribe(session_id, wake)
    try:
        await response.write(b": stream of session events\n\n")
        while True:
            wake.clear()
            try:
                still_active(api)  # the stream has begun: it ends instead of a 503
            except NotServing:
                break
            if api.engine.session_namespace(session_id) is None:  # deleted: say so, and end
                # The last event of a deleted session's stream; it has no id: nothing follows.
                deleted = SessionDeleted(session_id=session_id)
                kind = deleted.type.value
                await response.write(_sse(None, kind, {"type": kind, "data": deleted.as_json()}))
                break
            after = await _write_committed_events(api, response, session_id, after)
            while not deltas.empty():
                await response.write(_sse(None, "delta", deltas.get_nowait()))
            try:
                async with asyncio.timeout(SSE_KEEPALIVE_S):  # not wait_for: see dex_ha.server.leader
                    await wake.wait()
            except TimeoutError:
                await response.write(b": keep-alive\n\n")
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        waiters.remove(session_id, wake)
        api.node.relay.unsubscribe(session_id, deltas)


async def _write_committed_events(api: Api, response: web.StreamResponse, session_id: str, after: int) -> int:
    while True:
        page = api.engine.events_page(session_id, after, SSE_EVENTS_PER_READ, api.node.config.page_max_bytes)
        for e in page.items:
            await response.write(_sse(e.id, e.type, e.as_json()))
            after = e.event_id
        if not page.more:
            return after


def _sse(event_id: str | None, event_type: str, data: dict[str, Any]) -> bytes:
    lines = [] if event_id is None else [f"id: {event_id}"]
    lines += [f"event: {event_type}", f"data: {_dumps(data)}", "", ""]
    return "\n".join(lines).encode()


# ---------------------------------------------------------------- workers


async def register_agent(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    definition = {
        k: args[k] for k in ("tools", "compaction", "model", "description", "metadata") if args.get(k) is not None
    }
    role = args[CALLER].role
    result = await api.propose(
        RegisterAgent(
            at=api.node.clock.now_ms(),
            name=args["name"],
            definition=definition,
            namespace=args["namespace"],
            # Lowering a tool's approval is an admin's decision (no role: no tokens configured).
            may_lower_approval=role in (None, "admin"),
        )
    )
    registered = result.accepted_value()
    for change in registered.policy_changes:  # for the log only: the answer does not carry them
        log.info(
            "agent %r in namespace %r: tool %r policy %s -> %s (by a token of role %s)",
            args["name"],
            args["namespace"],
            change["tool"],
            _dumps(change["old"]),
            _dumps(change["new"]),
            role or "none (no tokens configured)",
        )
    return 200, {"name": registered.name, "version": registered.version, "changed": registered.changed}


def _check_agents_namespace(api: Api, agents: list[str], namespace: str) -> None:
    for agent in agents:
        if api.engine.agent_namespace(agent) not in (None, namespace):
            raise ApiError(403, "forbidden", f"agents: agent {agent!r} belongs to another namespace")


async def worker_poll(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    leader = api.node.serving()
    _check_agents_namespace(api, args["agents"], args["namespace"])
    tasks = await leader.poll(
        args["worker_id"],
        args["agents"],
        args["max_tasks"],
        args["wait_ms"],
        gone=lambda: request.transport is None or request.transport.is_closing(),
        namespace=args["namespace"],
    )
    if tasks:
        api.node.failpoints.hit("server.handout.after-commit")
    if not tasks:
        still_active(api)  # "no work" is this node's state; hand-outs rest on their commit
    return 200, {"tasks": tasks}


async def worker_channel(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    """The Worker channel (channel.py): checked as a poll is, then upgraded to a WebSocket
    that lives until the Worker or this node closes it."""
    leader = api.node.serving()
    agents = args["agents"].split(",")
    _check_agents_namespace(api, agents, args["namespace"])
    await _check_channel_version(api.node)
    config = api.node.config
    ws = web.WebSocketResponse(
        heartbeat=config.worker_channel_ping_ms / 1000,  # no pong within half of it: closed
        max_msg_size=config.max_result_bytes + CHANNEL_FRAME_MARGIN_BYTES,
        compress=False,  # deflate would cost more CPU per step than the whole frame's handling
        timeout=CHANNEL_CLOSE_TIMEOUT_S,  # a close that the Worker does not answer delays nothing longer
    )
    if not ws.can_prepare(request).ok:
        raise ApiError(400, "invalid", "this route opens a WebSocket: send an Upgrade: websocket request")
    await ws.prepare(request)
    worker_id = args["worker_id"]
    channel = WorkerChannel(
        api,
        leader,
        ws,
        worker_id=worker_id,
        agents=agents,
        namespace=args["namespace"],
        encoding=args["encoding"],
        check_report=lambda token: _reported_attempt(api, leader, {"task_token": token, "worker_id": worker_id}),
    )
    await channel.serve()
    return ws


async def _check_channel_version(node: NodeServer) -> None:
    """The channel's frames are ReportResults entries: while a member runs a state machine
    without it (a rolling upgrade), 404, as a node without the channel answers, so that a
    Worker polls over HTTP instead. A new cluster whose members all have it moves to it
    first (the version moves within a second by itself; a Worker must not wait for that)."""
    probe = ReportResults(at=0, reports=[])
    await node.move_version_for(probe)
    try:
        node.check_version_gate(probe)
    except ApiError as refused:
        raise ApiError(404, "not_found", f"no Worker channel yet: {refused}; poll over HTTP") from None


def _attempt_of(api: Api, args: dict[str, Any]) -> tuple[TaskToken, AttemptState]:
    """The attempt a Worker reports on, and its state; checked in this order:

    - 404 unless the token is one this cluster handed out: it parses and its secret is the
      attempt's. The secret is replicated, so after a failover it holds on the new node too.
    - 403 unless the body's worker_id is the Worker the attempt was handed to.

    Whether the attempt is still current (409) is for the caller: a heartbeat reads it
    here, a result is fenced when its command applies (a retried result that did commit
    gets 200 there). The secret and the worker id of an attempt never change, so checking
    them before the proposal cannot race with it.
    """
    token = TaskToken.parse(args["task_token"])
    state = None if token is None else api.engine.attempt_state(token.step_id, token.attempt, token.term, token.secret)
    if token is None or state is None:
        raise ApiError(404, "not_found", "no task was handed out with this task token")
    if state.worker_id != args["worker_id"]:
        raise _handed_to_another_worker(token)
    return token, state


def _handed_to_another_worker(token: TaskToken) -> ApiError:
    return ApiError(
        403,
        "forbidden",
        f"worker_id: attempt {token.attempt} of step {token.step_id!r} was "
        f"handed to another Worker; only that Worker may report on it",
    )


def _reported_attempt(api: Api, leader: LeaderTerm, args: dict[str, Any]) -> TaskToken:
    """The attempt a result or a failure reports on, checked as `_attempt_of` does.

    An attempt this leader handed out is checked against what it keeps in memory (the
    secret and Worker it committed with the hand-out), which spares the hot path a read of
    SQLite; any other token (another term's, after a restart) is read from the state.
    Whether the attempt is still current is fenced when the command applies.
    """
    token = TaskToken.parse(args["task_token"])
    handed_out = None if token is None else leader.issued(token)
    if token is None or handed_out is None:
        return _attempt_of(api, args)[0]
    if handed_out.worker_id != args["worker_id"]:
        raise _handed_to_another_worker(token)
    return token


async def task_heartbeat(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    leader = api.node.serving()
    token, state = _attempt_of(api, args)
    step_id, attempt = token.step_id, token.attempt
    if not state.current or token.term != leader.term:
        raise ApiError(
            409,
            "stale_attempt",
            f"attempt {attempt} of step {step_id!r} is no longer current ({state.status}); stop working on it",
        )
    running = leader.heartbeat(step_id, attempt)
    if running is not None and args.get("deltas"):
        api.node.relay.publish(running.session_id, step_id, attempt, args["deltas"])
    return 200, {"cancel": state.cancel_requested}


async def task_complete(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    leader = api.node.serving()
    token = _reported_attempt(api, leader, args)
    step_id, attempt, term = token.step_id, token.attempt, token.term
    running = leader.running.get((step_id, attempt))
    worker_id = running.worker_id if running is not None else None
    # Eager dispatch only for an attempt of this term whose Worker we know.
    eager = args["next_tasks"] if worker_id is not None and term == leader.term and not leader.draining else 0
    api.node.failpoints.hit("server.complete.before-propose")
    result = await api.propose(
        CompleteAttempt(
            at=api.node.clock.now_ms(),
            step_id=step_id,
            attempt=attempt,
            term=term,
            result=args["result"],
            next_worker_id=worker_id if eager else None,
            next_max=eager,
            next_token_secrets=[new_token_secret() for _ in range(eager)],
        )
    )
    api.node.failpoints.hit("server.complete.after-commit")
    leader.forget(step_id, attempt)
    started = result.accepted_value().started
    tasks = [leader.task_for_handout(s, worker_id) for s in started] if worker_id is not None else []
    if tasks:
        api.node.failpoints.hit("server.handout.after-commit")
    return 200, {"step_id": step_id, "attempt": attempt, "status": AttemptStatus.COMPLETED, "tasks": tasks}


async def task_fail(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    leader = api.node.serving()
    token = _reported_attempt(api, leader, args)
    step_id, attempt, term = token.step_id, token.attempt, token.term
    await api.propose(
        FailAttempt(
            at=api.node.clock.now_ms(),
            step_id=step_id,
            attempt=attempt,
            term=term,
            error=args["error"],
            retryable=args["retryable"],
            not_started=args["not_started"],
        )
    )
    leader.worker_failed(step_id, attempt, args["error"])
    return 200, {"step_id": step_id, "attempt": attempt, "status": AttemptStatus.FAILED}


# ---------------------------------------------------------------- backup


BACKUP_CHUNK_BYTES = 1 << 20


async def backup(api: Api, args: dict[str, Any], request: web.Request) -> Answer:
    """The backup file (see dex_ha/server/backup.py), streamed in chunks."""
    try:
        header, payload = await take_backup(api.node)
    except BackupNotPossible as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    still_active(api)
    parts = list(backup_bytes(header, payload))
    response = web.StreamResponse(
        headers={
            "Content-Type": "application/octet-stream",
            "Content-Length": str(sum(map(len, parts))),
            "Content-Disposition": f'attachment; filename="dex-ha-backup-{header.index}.dexbak"',
            "X-Dex-Backup-Index": str(header.index),
            "X-Dex-Backup-Term": str(header.term),
            "X-Dex-Backup-Sha256": header.sha256,
        }
    )
    await response.prepare(request)
    for part in parts:
        view = memoryview(part)
        for start in range(0, len(view), BACKUP_CHUNK_BYTES):
            await response.write(view[start : start + BACKUP_CHUNK_BYTES])
    await response.write_eof()
    return response


HANDLERS: dict[str, Handler] = {
    "livez": livez,
    "readyz": readyz,
    "metrics": metrics,
    "openapi": openapi,
    "cluster": cluster,
    "step_down": step_down,
    "add_member": add_member,
    "promote_member": promote_member,
    "remove_member": remove_member,
    "create_session": create_session,
    "list_sessions": list_sessions,
    "get_session": get_session,
    "send_message": send_message,
    "decide_approval": decide_approval,
    "answer_question": answer_question,
    "cancel_turn": cancel_turn,
    "delete_session": delete_session,
    "reconcile_tool_call": reconcile_tool_call,
    "session_events": session_events,
    "register_agent": register_agent,
    "worker_poll": worker_poll,
    "worker_channel": worker_channel,
    "task_heartbeat": task_heartbeat,
    "task_complete": task_complete,
    "task_fail": task_fail,
    "cluster_nodes": cluster_nodes,
    "backup": backup,
}

__all__ = ["ApiError", "ApiRunner", "HANDLERS", "NotServing", "build_app"]
