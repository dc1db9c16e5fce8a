"""The console on any node: a standby passes the console's API calls on to the active node.

The web console at /ui calls the API of the node that served it (its page may only talk to
its own origin, and its token is kept per origin). On a standby those calls would all be
answered 503 `not_active`. So the console marks its calls with `Dex-Forward: active`, and a
node that is not active passes such a call on to the active node and relays the answer,
streams (the session's events) included. The browser never leaves the node it opened, and
the token it was given once works whichever node is active.

The call is passed on only after this node has accepted its token (the pipeline checks it
first), only for the routes in FORWARDED_ROUTES, and only to the URL the cluster's
membership names for the leader: the same URL that a client given several nodes follows
with its token after a 503 `not_active`. The caller's own token goes with it, so the active
node checks the caller's role and namespace as for any other call. A forwarded call does not
carry `Dex-Forward`: a node that has lost the leadership meanwhile answers 503 instead of
passing it on again, so a call makes at most one hop.

Other callers (the SDKs, the CLI, Workers) are not forwarded: they follow `leader_url`
themselves, and a Worker must talk to the active node directly.
"""

from __future__ import annotations

import aiohttp
from aiohttp import web
from yarl import URL

from dex_ha.server.errors import NotActive
from dex_ha.server.http_limits import SERVER_NAME

FORWARD_HEADER = "Dex-Forward"
FORWARD_TO_ACTIVE = "active"
# The routes the console calls that only the active node serves (api_spec.ROUTES names).
FORWARDED_ROUTES = frozenset(
    {
        "list_sessions",
        "get_session",
        "session_events",
        "send_message",
        "decide_approval",
        "answer_question",
        "cancel_turn",
        "reconcile_tool_call",
        "step_down",
        "add_member",
        "promote_member",
        "remove_member",
    }
)
# What of the caller's request goes on, and what of the active node's answer comes back.
PASSED_REQUEST_HEADERS = ("Authorization", "Content-Type", "Dex-Namespace", "Last-Event-ID")
PASSED_ANSWER_HEADERS = ("Content-Type", "Cache-Control", "Retry-After", "X-Accel-Buffering")
CONNECT_TIMEOUT_S = 2.0
# The active node writes to an event stream at least every 15 s (a keep-alive): a forwarded
# answer silent for longer than this has lost its node.
READ_TIMEOUT_S = 40.0


def wants_forwarding(route_name: str, request: web.Request) -> bool:
    """Whether the caller asked for this call to go to the active node (the console does)."""
    asked = request.headers.get(FORWARD_HEADER, "").strip().lower() == FORWARD_TO_ACTIVE
    return asked and route_name in FORWARDED_ROUTES


async def forward(request: web.Request, body: bytes | None, leader_url: str) -> web.StreamResponse:
    """Send the request to `leader_url` and relay its answer, piece by piece as it comes.
    503 `not_active` (naming the leader) when the active node cannot be reached."""
    target = URL(leader_url.rstrip("/") + request.raw_path, encoded=True)
    headers = {name: request.headers[name] for name in PASSED_REQUEST_HEADERS if name in request.headers}
    headers["User-Agent"] = SERVER_NAME
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        try:
            upstream = await http.request(request.method, target, data=body, headers=headers, allow_redirects=False)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise NotActive(
                f"this node is not the active node, and the active node at {leader_url} did not answer "
                f"({type(exc).__name__}); retry in a moment"
            ) from None
        async with upstream:
            answer = web.StreamResponse(
                status=upstream.status,
                headers={name: upstream.headers[name] for name in PASSED_ANSWER_HEADERS if name in upstream.headers},
            )
            await answer.prepare(request)
            async for piece in upstream.content.iter_any():
                await answer.write(piece)
            await answer.write_eof()
            return answer
