"""Every route of the HTTP API, declared once.

This table is the single source for request validation (`validation.py`), token checks
(`auth.py`) and the OpenAPI document (`openapi.py`); the aiohttp app binds one handler to
each route by its `name`. Names, methods and paths are a contract: SDKs in any language and
tests outside this repository use them.

A route's `responses` list every status it can answer. The statuses that follow from the
shape of a route (400 when it takes input, 401/403 when it needs a token, 413 when it takes
a body, 503 when only the active node serves it) are added by `_route`, so no route can
forget them; a route declares only its own (2xx, 404, 409).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from dex_ha.engine.statuses import CallStatus, SessionStatus

FIELD_TYPES = ("string", "integer", "number", "boolean", "object", "array", "any")

# String formats checked by validation.py and named in the OpenAPI document.
#   id:        1..200 printable characters (the same rule as the engine's ids)
#   host-port: "host:port" (IPv6 hosts in brackets), port 1..65535
#   uri:       an absolute http:// or https:// URL
FORMATS = ("id", "host-port", "uri")

# The ids a client or Worker chooses for what it creates (sessions, agents): a letter or
# digit, then letters, digits and . _ : - (so never "." or "..", nothing a URL path, a shell
# or a log line must escape). Other ids (calls, questions, messages, Workers) stay any
# printable text, as do the ids in paths, so sessions created before this rule stay reachable.
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._:-]*"
METADATA_FILTER_PATTERN = r"[^=]+=.*"  # GET /v1/sessions?metadata=key=value
# What validation.py says of a value that does not match a pattern, by pattern.
PATTERN_RULES = {
    NAME_PATTERN: "must start with a letter or digit and hold only letters, digits, '.', '_', ':' and '-'",
    METADATA_FILTER_PATTERN: "must be key=value (a top-level key of the metadata, then its value)",
}
MAX_ID_LENGTH = 200
SESSION_ORDERS = ("newest", "id")  # the orders of GET /v1/sessions; the first is the default
MAX_MEMBER_ID_LENGTH = 64
MAX_REASON_LENGTH = 4096
MAX_ERROR_LENGTH = 65_536
MAX_ITEMS = 1000
DEFAULT_MAX_BODY_BYTES = 1 << 20

CLIENT = frozenset({"client"})
WORKER = frozenset({"worker"})
ADMIN = frozenset({"admin"})
ANY_ROLE = frozenset({"admin", "client", "worker"})
# Methods whose requests may carry a body: a JSON one only (415 otherwise, see browsers.py).
MUTATING_METHODS = frozenset({"POST", "PUT", "DELETE"})


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One named input: a body field, a query parameter, a path parameter or a header."""

    name: str
    type: str  # one of FIELD_TYPES; "any" is any JSON value, null included
    required: bool = False
    description: str = ""
    enum: tuple[str, ...] | None = None
    min: int | None = None  # integer bounds, inclusive
    max: int | None = None
    max_length: int | None = None  # strings: characters; arrays: items
    # Arrays: the elements' spec; a type name is short for a spec of just that type.
    items: FieldSpec | str | None = None
    nullable: bool = False
    default: Any = None
    min_length: int | None = None  # strings: characters; arrays: items
    pattern: str | None = None  # strings: a regular expression the whole value must match
    format: str | None = None  # strings: one of FORMATS
    # The ServerConfig setting that caps the field's size in bytes (a string's UTF-8, any
    # other value's JSON): over it, 413 `too_large` naming the field (validation.py).
    max_bytes: str | None = None

    def __post_init__(self) -> None:
        # A typo in the table should fail at import, not as a confusing 400 later.
        if self.type not in FIELD_TYPES:
            raise ValueError(f"field {self.name!r}: unknown type {self.type!r}")
        if isinstance(self.items, str):
            object.__setattr__(self, "items", FieldSpec("items", self.items))  # frozen: set once, here
        if self.type == "array" and self.items is None:
            raise ValueError(f"field {self.name!r}: an array needs an items type")
        if self.format is not None and self.format not in FORMATS:
            raise ValueError(f"field {self.name!r}: unknown format {self.format!r}")
        if self.pattern is not None:
            re.compile(self.pattern)


@dataclass(frozen=True, slots=True)
class RouteSpec:
    """One route: where it lives, who may call it, what it takes and what it answers."""

    name: str  # the handler's name, e.g. "create_session"
    method: str  # "GET" | "POST" | "PUT" | "DELETE"
    path: str  # aiohttp pattern, e.g. "/v1/sessions/{session_id}"
    roles: frozenset[str] | None  # roles allowed (admin always is); None: operations route
    summary: str
    body: tuple[FieldSpec, ...] | None = None  # None: no JSON body expected
    query: tuple[FieldSpec, ...] = ()
    path_params: tuple[FieldSpec, ...] = ()
    responses: Mapping[int, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    active_only: bool = True  # only the active node serves it; others answer 503
    # Counted in the node's bound on requests in flight (503 `overloaded` past it). False
    # for probes, which must never be shed, for long-lived requests, and for a Worker's
    # heartbeats and results, which the hand-outs already bound (see admission.py).
    bounded: bool = True
    stream: bool = False  # Server-Sent Events
    headers: tuple[FieldSpec, ...] = ()  # request headers the route reads
    content_type: str = "application/json"  # of the success response

    @property
    def body_required(self) -> bool:
        """True when a request without a body cannot be valid (some body field is required)."""
        return self.body is not None and any(f.required for f in self.body)


# ---------------------------------------------------------------- field helpers


def _id(
    name: str, description: str, *, required: bool = True, nullable: bool = False, max_length: int = MAX_ID_LENGTH
) -> FieldSpec:
    return FieldSpec(
        name,
        "string",
        required=required,
        nullable=nullable,
        description=description,
        min_length=1,
        max_length=max_length,
        format="id",
    )


def _new_name(name: str, description: str, *, required: bool = True, nullable: bool = False) -> FieldSpec:
    """The id of something a request creates (a session, an agent): NAME_PATTERN."""
    return FieldSpec(
        name,
        "string",
        required=required,
        nullable=nullable,
        description=f"{description} A letter or digit, then letters, digits, '.', '_', ':' and '-'.",
        min_length=1,
        max_length=MAX_ID_LENGTH,
        pattern=NAME_PATTERN,
    )


def _reason(name: str, description: str) -> FieldSpec:
    return FieldSpec(name, "string", nullable=True, max_length=MAX_REASON_LENGTH, description=description)


def _object(name: str, description: str, *, max_bytes: str | None = None) -> FieldSpec:
    return FieldSpec(name, "object", nullable=True, description=description, max_bytes=max_bytes)


# The settings (ServerConfig) that cap a field's size: FieldSpec.max_bytes.
METADATA_CAP = "max_metadata_bytes"
MESSAGE_CAP = "max_message_bytes"
RESULT_CAP = "max_result_bytes"


SESSION_ID = _id("session_id", "The session's id.")
CALL_ID = _id("call_id", "The tool call's id (the model's call id).")
QUESTION_ID = _id("question_id", "The question's id.")
TASK_TOKEN = _id("task_token", "The task token that the poll answer handed out (opaque).")
# A task's heartbeat, complete and fail come from the Worker that polled it, and only from it.
TASK_WORKER_ID = _id("worker_id", "The id of the Worker that polled the task; another Worker's report is 403.")
TASK_REPORT_ERRORS = MappingProxyType(
    {
        403: "forbidden: the token's role may not call this route, or worker_id is not the Worker the task "
        "was handed to, or the request came from a web page of another site (Origin)",
        404: "not_found: no task was handed out with this token",
        409: "stale_attempt: the attempt is no longer current",
    }
)
AGENT_NAME = _new_name("name", "The agent's name.")
# The namespace a request works in (docs/api.md, "Namespaces"): sessions and agents of
# another namespace are out of its reach.
NAMESPACE_HEADER = "Dex-Namespace"
NAMESPACE = FieldSpec(
    NAMESPACE_HEADER,
    "string",
    min_length=1,
    max_length=MAX_ID_LENGTH,
    pattern=NAME_PATTERN,
    description="The namespace to work in. Omitted: the token's only namespace if it is limited to one, "
    "else `default`. A token limited to other namespaces is 403. A letter or digit, then letters, digits, "
    "'.', '_', ':' and '-'.",
)
MEMBER_ID = _id("member_id", "The member's node id.", max_length=MAX_MEMBER_ID_LENGTH)


# ---------------------------------------------------------------- the route factory

# The 503 of an event stream past a cap on open streams (admission.StreamAdmission).
STREAMS_OVERLOADED = (
    "overloaded: the node has max_streams event streams open, or this token max_streams_per_token "
    "(the message names the cap); close a stream or retry after Retry-After"
)
# The 503 of a write that did not commit in time (errors.NotCommitted).
UNAVAILABLE = (
    "unavailable: the write was not committed within proposal_timeout_ms (fewer than a quorum of the voters "
    "stored it); it may still commit, retry it with the same ids"
)


def _route(
    name: str,
    method: str,
    path: str,
    roles: frozenset[str] | None,
    summary: str,
    *,
    success: Mapping[int, str],
    errors: Mapping[int, str] | None = None,
    body: tuple[FieldSpec, ...] | None = None,
    query: tuple[FieldSpec, ...] = (),
    path_params: tuple[FieldSpec, ...] = (),
    headers: tuple[FieldSpec, ...] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    active_only: bool = True,
    bounded: bool = True,
    stream: bool = False,
    content_type: str = "application/json",
    proposes: bool = False,
) -> RouteSpec:
    """A RouteSpec whose responses include every status that its shape implies. `proposes`:
    the route writes through the replicated log, so it may answer 503 `unavailable`."""
    responses: dict[int, str] = {**success, **(errors or {})}
    if body is not None or query or path_params or headers:
        responses.setdefault(400, "invalid: a field, parameter or header is missing or wrong (the message names it)")
    if roles is not None:
        responses.setdefault(401, "unauthorized: no token, a malformed Authorization header or an unknown token")
        responses.setdefault(
            403,
            "forbidden: the token's role may not call this route, "
            + ("or the token may not use the namespace, " if NAMESPACE in headers else "")
            + "or the request came from a web page of another site (Origin)",
        )
    responses.setdefault(403, "forbidden: the request came from a web page of another site (Origin)")
    if body is not None:
        capped = [f"{spec.name} (over {spec.max_bytes})" for spec in body if spec.max_bytes is not None]
        responses.setdefault(
            413,
            f"too_large: the body is over {max_body_bytes} bytes"
            + (f", or a field is over its size cap: {', '.join(capped)}; the message names it" if capped else ""),
        )
    if method in MUTATING_METHODS:
        responses.setdefault(415, "unsupported_media_type: the Content-Type is not application/json")
    responses.setdefault(421, "misdirected_request: the Host header names no name this node serves under")
    if active_only:
        responses.setdefault(
            503,
            "not_active: this node is not the active node; retry, or follow leader_url; or no_space: "
            "this node's disk is full, retry (it resumes by itself once space is freed)"
            + ("; or overloaded: the node sheds load, retry after Retry-After" if bounded or body is not None else "")
            + (f"; or {STREAMS_OVERLOADED}" if stream else "")
            + (f"; or {UNAVAILABLE}" if proposes else ""),
        )
    elif bounded or body is not None:
        responses.setdefault(503, "overloaded: the node sheds load; retry after Retry-After")
    return RouteSpec(
        name=name,
        method=method,
        path=path,
        roles=roles,
        summary=summary,
        body=body,
        query=query,
        path_params=path_params,
        headers=headers,
        responses=MappingProxyType(dict(sorted(responses.items()))),
        max_body_bytes=max_body_bytes,
        active_only=active_only,
        bounded=bounded,
        stream=stream,
        content_type=content_type,
    )


# ---------------------------------------------------------------- operations


_OPERATIONS = (
    _route(
        "livez",
        "GET",
        "/livez",
        None,
        "Liveness: 200 while the process serves HTTP.",
        success={200: "the process is alive"},
        active_only=False,
        bounded=False,
    ),
    _route(
        "readyz",
        "GET",
        "/readyz",
        None,
        "Readiness: 200 only on the active node (leader, lease valid, takeover done, not draining).",
        success={200: "this node is the active node"},
        errors={503: "not ready: not the leader, lease not valid, takeover not done, or draining"},
        active_only=False,
        bounded=False,
    ),
    _route(
        "metrics",
        "GET",
        "/metrics",
        None,
        "Prometheus metrics (prefix dex_).",
        success={200: "metrics in the Prometheus text format"},
        active_only=False,
        content_type="text/plain; version=0.0.4",
    ),
    _route(
        "openapi",
        "GET",
        "/openapi.json",
        None,
        "This OpenAPI document.",
        success={200: "the OpenAPI 3.1 document"},
        active_only=False,
    ),
)


# ---------------------------------------------------------------- client role


_SESSIONS = (
    _route(
        "create_session",
        "POST",
        "/v1/sessions",
        CLIENT,
        "Create a session (idempotent by session_id).",
        headers=(NAMESPACE,),
        success={
            200: "the session already exists with the same agent; the same session",
            201: "created; the body holds session_id",
        },
        errors={
            409: "conflict: the session id exists with another agent or other metadata (the message names the field)"
        },
        body=(
            _new_name("agent", "The name of the agent that runs the session."),
            _new_name(
                "session_id",
                "The id to use; omitted or null lets the server choose one.",
                required=False,
                nullable=True,
            ),
            _object(
                "metadata",
                "Free-form JSON object stored with the session. Repeating a create with the same "
                "session_id and other metadata is 409; omitted or null matches any.",
                max_bytes=METADATA_CAP,
            ),
        ),
        proposes=True,
    ),
    _route(
        "list_sessions",
        "GET",
        "/v1/sessions",
        CLIENT,
        "List sessions, newest first (or by id), filtered and paginated.",
        headers=(NAMESPACE,),
        success={200: "a page of sessions and the cursor for the next page"},
        query=(
            FieldSpec("agent", "string", max_length=MAX_ID_LENGTH, description="Only this agent's sessions."),
            FieldSpec("status", "string", enum=tuple(SessionStatus), description="Only sessions in this status."),
            FieldSpec(
                "order",
                "string",
                enum=SESSION_ORDERS,
                default="newest",
                description="newest: by creation time, newest first (sessions created in the same millisecond "
                "by id, descending); id: by session id.",
            ),
            FieldSpec(
                "id_contains",
                "string",
                min_length=1,
                max_length=MAX_ID_LENGTH,
                description="Only sessions whose id contains this text (case matters).",
            ),
            FieldSpec(
                "metadata",
                "string",
                max_length=MAX_ID_LENGTH,
                pattern=METADATA_FILTER_PATTERN,
                description="key=value: only sessions whose metadata has this top-level key with this value "
                "(a string as it is; a number, true, false or null as written in JSON).",
            ),
            FieldSpec(
                "limit",
                "integer",
                min=1,
                max=1000,
                default=100,
                description="Page size: at most this many sessions. A page also ends once it holds the node's "
                "page_max_bytes; next_after says where the next one starts.",
            ),
            FieldSpec(
                "after",
                "string",
                max_length=MAX_ID_LENGTH + 21,
                description="The cursor from the previous page (its next_after): sessions after it. Pass it with "
                "the same order and filters.",
            ),
            FieldSpec(
                "awaiting_approval",
                "boolean",
                description="true: only sessions with a tool call waiting for approval; false: only "
                "sessions without one.",
            ),
            FieldSpec(
                "outcome_unknown",
                "boolean",
                description="true: only sessions with an outcome_unknown tool call to reconcile; "
                "false: only sessions without one.",
            ),
        ),
    ),
    _route(
        "get_session",
        "GET",
        "/v1/sessions/{session_id}",
        CLIENT,
        "The agent snapshot: status, turn, history, tool calls with their attempts, pending waits.",
        headers=(NAMESPACE,),
        success={200: "the agent snapshot"},
        errors={404: "not_found: no such session in the namespace"},
        path_params=(SESSION_ID,),
    ),
    _route(
        "delete_session",
        "DELETE",
        "/v1/sessions/{session_id}",
        CLIENT,
        "Delete an ended session and everything of it: messages, turns, history, tool calls, steps, "
        "attempts, events. A session with a running turn is 409: cancel the turn first.",
        headers=(NAMESPACE,),
        success={200: "deleted (the body holds session_id and deleted: true); its open event streams end"},
        errors={
            404: "not_found: no such session in the namespace (deleted already, or never created)",
            409: "conflict: the session has a running turn (the message names it); cancel it, then delete",
        },
        path_params=(SESSION_ID,),
        proposes=True,
    ),
    _route(
        "send_message",
        "POST",
        "/v1/sessions/{session_id}/messages",
        CLIENT,
        "Send a user message; a repeated message_id is a no-op.",
        headers=(NAMESPACE,),
        success={202: "accepted (or already accepted, for a repeated message_id)"},
        errors={
            404: "not_found: no such session in the namespace",
            409: "conflict: the message_id was already sent with another text or mode (the message names the field)",
        },
        path_params=(SESSION_ID,),
        body=(
            FieldSpec(
                "text",
                "string",
                required=True,
                min_length=1,
                max_bytes=MESSAGE_CAP,
                description="The user's message.",
            ),
            _id("message_id", "Client-chosen id that makes retries safe.", required=False, nullable=True),
            FieldSpec(
                "mode",
                "string",
                enum=("queue", "steer"),
                default="queue",
                description="queue: after the running turn; steer: at the next model call.",
            ),
        ),
        # Room for a text of max_message_bytes (by default) even when much of it is JSON-escaped.
        max_body_bytes=4 << 20,
        proposes=True,
    ),
    _route(
        "decide_approval",
        "POST",
        "/v1/sessions/{session_id}/approvals/{call_id}",
        CLIENT,
        "Approve or deny a tool call that waits for approval.",
        headers=(NAMESPACE,),
        success={200: "recorded (the same decision again is a no-op)"},
        errors={
            404: "not_found: no such session in the namespace, or the call awaits no approval",
            409: "conflict: a different decision was already made, or the turn was cancelled",
        },
        path_params=(SESSION_ID, CALL_ID),
        body=(
            FieldSpec("approved", "boolean", required=True, description="true runs the tool; false denies it."),
            _reason("reason", "Why; a denial's reason is what the model sees."),
        ),
        proposes=True,
    ),
    _route(
        "answer_question",
        "POST",
        "/v1/sessions/{session_id}/questions/{question_id}/answer",
        CLIENT,
        "Answer a question that the model or a tool asked.",
        headers=(NAMESPACE,),
        success={200: "recorded (the same answer again is a no-op)"},
        errors={
            404: "not_found: no such session in the namespace, or no such question",
            409: "conflict: a different answer was already given, or the turn was cancelled",
        },
        path_params=(SESSION_ID, QUESTION_ID),
        body=(
            FieldSpec("answer", "any", required=True, max_bytes=MESSAGE_CAP, description="The answer, any JSON value."),
        ),
        max_body_bytes=4 << 20,  # as a message's: an answer is one
        proposes=True,
    ),
    _route(
        "cancel_turn",
        "POST",
        "/v1/sessions/{session_id}/cancel",
        CLIENT,
        "Cancel the running turn (the body is optional).",
        headers=(NAMESPACE,),
        success={200: "cancelled, or nothing was running"},
        errors={404: "not_found: no such session in the namespace"},
        path_params=(SESSION_ID,),
        body=(_reason("reason", "Why the turn was cancelled."),),
        proposes=True,
    ),
    _route(
        "reconcile_tool_call",
        "POST",
        "/v1/sessions/{session_id}/tool-calls/{call_id}/reconcile",
        CLIENT,
        "Settle a tool call whose outcome is unknown.",
        headers=(NAMESPACE,),
        success={200: "reconciled (the same outcome again is a no-op)"},
        errors={
            404: "not_found: no such session in the namespace, or no such tool call",
            409: "conflict: the call's outcome is not unknown, or it was reconciled differently",
        },
        path_params=(SESSION_ID, CALL_ID),
        body=(
            FieldSpec(
                "outcome",
                "string",
                required=True,
                enum=(CallStatus.SUCCEEDED, CallStatus.FAILED),
                description="What really happened.",
            ),
            FieldSpec("result", "any", max_bytes=RESULT_CAP, description="The tool's output, when it succeeded."),
            FieldSpec("error", "string", nullable=True, description="The error, when it failed."),
        ),
        max_body_bytes=4 << 20,  # as a Worker's result: this is one
        proposes=True,
    ),
    _route(
        "session_events",
        "GET",
        "/v1/sessions/{session_id}/events",
        CLIENT,
        "Server-Sent Events: committed session events (with ids) and live delta events.",
        success={200: "an event stream"},
        errors={404: "not_found: no such session in the namespace"},
        path_params=(SESSION_ID,),
        query=(FieldSpec("after", "string", pattern=r"[0-9]{1,20}", description="Resume after this event id."),),
        headers=(
            NAMESPACE,
            FieldSpec(
                "Last-Event-ID",
                "string",
                pattern=r"[0-9]{1,20}",
                description="Resume after this event id (the SSE reconnect header).",
            ),
        ),
        stream=True,
        bounded=False,
        content_type="text/event-stream",
    ),
)


# ---------------------------------------------------------------- worker role


_WORKER = (
    _route(
        "register_agent",
        "PUT",
        "/v1/agents/{name}",
        WORKER,
        "Register or change an agent definition (tools and their policies).",
        headers=(NAMESPACE,),
        success={200: "registered (the same definition again is a no-op)"},
        path_params=(AGENT_NAME,),
        body=(
            FieldSpec(
                "tools",
                "array",
                required=True,
                items="object",
                max_length=MAX_ITEMS,
                description="The tools: name, description, input_schema, effect, approval, inline, "
                "start_to_close_ms, max_attempts.",
            ),
            _object("compaction", "When to compact the history: max_items, max_tokens."),
            _object("model", "Model step policy: start_to_close_ms."),
            FieldSpec("description", "string", nullable=True, description="What the agent does."),
            _object("metadata", "Free-form JSON object stored with the agent.", max_bytes=METADATA_CAP),
        ),
        proposes=True,
    ),
    _route(
        "worker_poll",
        "POST",
        "/v1/worker/poll",
        WORKER,
        "Long-poll for tasks of the given agents; each hand-out is committed before the answer.",
        headers=(NAMESPACE,),
        success={200: "tasks (possibly none when wait_ms ran out)"},
        body=(
            _id(
                "worker_id",
                "The Worker's id, recorded on each attempt handed to it; its heartbeats and "
                "results for those tasks must carry the same id.",
            ),
            FieldSpec(
                "agents",
                "array",
                required=True,
                min_length=1,
                max_length=100,
                items=_id("agent", "An agent name."),
                description="The agents whose steps this Worker runs.",
            ),
            FieldSpec(
                "max_tasks", "integer", min=1, max=1000, default=1, description="At most this many tasks in the answer."
            ),
            FieldSpec(
                "wait_ms",
                "integer",
                min=0,
                max=60_000,
                default=20_000,
                description="How long to wait for a task before answering with none.",
            ),
        ),
        bounded=False,
    ),
    _route(
        "worker_channel",
        "GET",
        "/v1/worker/channel",
        WORKER,
        "Open the Worker channel: a WebSocket that carries tasks to the Worker and its results back "
        "(the frames are in docs/worker-protocol.md).",
        headers=(NAMESPACE,),
        success={101: "switching to the WebSocket protocol: the channel is open"},
        errors={
            400: "invalid: a parameter is missing or wrong, or the request is not a WebSocket upgrade",
            404: "not_found: no channel while a member of the cluster runs a release without it (a rolling "
            "upgrade): the Worker polls over HTTP",
        },
        query=(
            _id("worker_id", "The Worker's id, recorded on each attempt handed to it over this channel."),
            FieldSpec(
                "agents",
                "string",
                required=True,
                max_length=100 * (MAX_ID_LENGTH + 1),
                pattern=f"{NAME_PATTERN}(,{NAME_PATTERN})*",
                description="The agents whose steps this Worker runs, comma-separated.",
            ),
            FieldSpec(
                "encoding",
                "string",
                enum=("msgpack", "json"),
                default="msgpack",
                description="msgpack: binary frames (the default); json: text frames.",
            ),
        ),
        bounded=False,  # long-lived, as a long poll; the connection cap bounds it
    ),
    _route(
        "task_heartbeat",
        "POST",
        "/v1/worker/tasks/{task_token}/heartbeat",
        WORKER,
        "Keep a task's attempt alive and relay stream deltas; the answer says whether to cancel.",
        success={200: "the attempt is current; the body says whether to cancel"},
        errors=TASK_REPORT_ERRORS,
        path_params=(TASK_TOKEN,),
        body=(
            TASK_WORKER_ID,
            FieldSpec(
                "deltas",
                "array",
                items="object",
                max_length=MAX_ITEMS,
                nullable=True,
                description="Live output since the previous heartbeat (model text deltas).",
            ),
        ),
        max_body_bytes=256 << 10,
        bounded=False,  # a Worker's report on an attempt it was handed: see RouteSpec.bounded
    ),
    _route(
        "task_complete",
        "POST",
        "/v1/worker/tasks/{task_token}/complete",
        WORKER,
        "Report a task's result.",
        success={
            200: "the result is committed; `tasks` holds the steps handed to this Worker in the "
            "same entry when `next_tasks` asked for them"
        },
        errors=TASK_REPORT_ERRORS,
        path_params=(TASK_TOKEN,),
        body=(
            TASK_WORKER_ID,
            FieldSpec(
                "result",
                "any",
                required=True,
                max_bytes=RESULT_CAP,
                description="The step's result (its shape depends on the kind).",
            ),
            FieldSpec(
                "next_tasks",
                "integer",
                min=0,
                max=16,
                default=0,
                description="Eager dispatch: hand this Worker up to this many queued steps of "
                "the agent in the same commit, from the head of the queue (first in, first "
                "out, whichever session); they come back in `tasks`, as a poll's.",
            ),
        ),
        max_body_bytes=4 << 20,
        bounded=False,  # a Worker's report on an attempt it was handed: see RouteSpec.bounded
        proposes=True,
    ),
    _route(
        "task_fail",
        "POST",
        "/v1/worker/tasks/{task_token}/fail",
        WORKER,
        "Report that a task's attempt failed.",
        success={200: "the failure is committed"},
        errors=TASK_REPORT_ERRORS,
        path_params=(TASK_TOKEN,),
        body=(
            TASK_WORKER_ID,
            FieldSpec("error", "string", required=True, max_length=MAX_ERROR_LENGTH, description="What went wrong."),
            FieldSpec(
                "retryable",
                "boolean",
                default=True,
                description="false: do not try this step again (the step kind's exhaustion rule decides the outcome).",
            ),
            FieldSpec(
                "not_started",
                "boolean",
                default=False,
                description="true: the Worker never called the tool function in this attempt "
                "(unknown tool, arguments refused). If no attempt of the call could "
                "have run, the call records failed with NOT_STARTED and an error that "
                'begins "the tool did not run, so it is safe to call again"; '
                "otherwise it changes nothing about the call's outcome.",
            ),
        ),
        bounded=False,  # a Worker's report on an attempt it was handed: see RouteSpec.bounded
        proposes=True,
    ),
)


# ---------------------------------------------------------------- cluster (admin)


_CLUSTER = (
    _route(
        "cluster",
        "GET",
        "/v1/cluster",
        ANY_ROLE,
        "This node's view of the cluster: its cluster id, role, term, leader, indexes, lease, alarms (no_space), "
        "its release (version) and state machine (state_machine_version), the cluster's state machine "
        "(cluster_state_machine_version), members (each with its URL, Raft address, consistency alarm, and "
        "release and state machine as this node last heard them).",
        success={200: "the cluster table"},
        active_only=False,
    ),
    _route(
        "cluster_nodes",
        "GET",
        "/v1/cluster/nodes",
        ANY_ROLE,
        "Every member's own view (GET /v1/cluster of each, asked by this node with the cluster's own "
        "credential, never the caller's token); a member that does not answer within 1 s is listed with "
        "reachable false.",
        success={200: "one entry per member: id, url, voter, reachable, and view or error"},
        active_only=False,
    ),
    _route(
        "step_down",
        "POST",
        "/v1/cluster/step-down",
        ADMIN,
        "Planned step down: drain, then transfer leadership (the body is optional).",
        success={200: "leadership was transferred"},
        errors={
            404: "not_found: `to` is not a voting member",
            409: "conflict: no voter can take over, or a step down is already in progress",
        },
        body=(
            _id(
                "to",
                "The member to hand leadership to; omitted: the most caught-up voter.",
                required=False,
                nullable=True,
                max_length=MAX_MEMBER_ID_LENGTH,
            ),
            FieldSpec(
                "drain_timeout_ms",
                "integer",
                min=0,
                max=3_600_000,
                nullable=True,
                description="How long running attempts may finish first; omitted: the configured default.",
            ),
        ),
    ),
    _route(
        "add_member",
        "POST",
        "/v1/cluster/members",
        ADMIN,
        "Add a node as a learner (cold standby).",
        success={200: "the member was added as a learner"},
        errors={409: "conflict: the id or address is already a member, or another change is in progress"},
        body=(
            _id("id", "The new member's node id.", max_length=MAX_MEMBER_ID_LENGTH),
            FieldSpec(
                "raft_addr",
                "string",
                required=True,
                max_length=MAX_ID_LENGTH,
                format="host-port",
                description="The member's Raft address, host:port.",
            ),
            FieldSpec(
                "url",
                "string",
                required=True,
                max_length=2048,
                format="uri",
                description="The member's HTTP base URL (http or https).",
            ),
        ),
    ),
    _route(
        "promote_member",
        "POST",
        "/v1/cluster/members/{member_id}/promote",
        ADMIN,
        "Promote a learner to a voter.",
        success={200: "the member is a voter"},
        errors={
            404: "not_found: no such member",
            409: "conflict: the member is already a voter, not caught up, or another change is in progress",
        },
        path_params=(MEMBER_ID,),
    ),
    _route(
        "remove_member",
        "DELETE",
        "/v1/cluster/members/{member_id}",
        ADMIN,
        "Remove a member.",
        success={200: "the member was removed"},
        errors={404: "not_found: no such member", 409: "conflict: another membership change is in progress"},
        path_params=(MEMBER_ID,),
    ),
)


# ---------------------------------------------------------------- backup (admin)


_BACKUP = (
    _route(
        "backup",
        "GET",
        "/v1/cluster/backup",
        ADMIN,
        "A consistent backup of the state, taken while the node serves: a dex-ha backup file "
        "(header with format version, index, term, schema version, created_at and sha256, then "
        "the state). `dex-ha backup` writes it to a file; `dex-ha restore` seeds a new cluster from it.",
        success={200: "the backup file"},
        errors={409: "conflict: the copy's index left the Raft log meanwhile; try again"},
        content_type="application/octet-stream",
    ),
)


ROUTES: tuple[RouteSpec, ...] = _OPERATIONS + _SESSIONS + _WORKER + _CLUSTER + _BACKUP
ROUTES_BY_NAME: Mapping[str, RouteSpec] = MappingProxyType({route.name: route for route in ROUTES})

if len(ROUTES_BY_NAME) != len(ROUTES):  # pragma: no cover - guards edits to the table
    raise RuntimeError("two routes share a name")


def _field_cap_ceilings() -> dict[str, int]:
    """Each size setting's highest value: the smallest body limit of the routes it caps a
    field of (a cap above it could never be reached)."""
    ceilings: dict[str, int] = {}
    for route in ROUTES:
        for spec in route.body or ():
            if spec.max_bytes is not None:
                ceilings[spec.max_bytes] = min(ceilings.get(spec.max_bytes, route.max_body_bytes), route.max_body_bytes)
    return ceilings


FIELD_CAP_CEILINGS: Mapping[str, int] = MappingProxyType(_field_cap_ceilings())
