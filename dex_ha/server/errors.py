"""Every error the HTTP API answers, as one hierarchy (like httpx's `_exceptions.py`).

An `HttpError` carries its answer: the status, the `error` code for programs, the
`message` for people, response headers and any extra body fields. Code anywhere under a
route raises one; the request pipeline (app.py) renders every one the same way, as
`{"error": code, "message": message, **extra}`, so no handler writes an error response of
its own. Errors of other layers (Raft's NotLeader, ProposalDropped, EntryTooLarge) become
HttpErrors in `from_raft`.

This module imports nothing of the server, so any module may raise these errors.

    HttpError                 (where it is defined or raised)
    ├── ApiError              any status and code a handler decides on (app.py)
    ├── InvalidRequest        400 invalid, "<field>: <what is wrong>" (validation.py)
    ├── AuthError             401 unauthorized / 403 forbidden (auth.py)
    ├── CrossSiteOrigin       403 forbidden: a web page of another site (browsers.py)
    ├── BodyTimeout           408 request_timeout (http_limits.py)
    ├── StepDownFailed        409 step_down_failed (node.py)
    │   └── UnknownMember     404 not_found: the step down names no other voter
    ├── MemberNotCaughtUp     409 conflict: a learner too far behind to promote (node.py)
    ├── BodyTooLarge          413 too_large (validation.py)
    ├── UnsupportedMediaType  415 unsupported_media_type: a POST or PUT that is not JSON (browsers.py)
    ├── MisdirectedHost       421 misdirected_request: a Host the node does not serve (browsers.py)
    ├── Overloaded            503 overloaded, Retry-After (admission.py)
    ├── NotCommitted          503 unavailable, Retry-After: a write not committed in time (node.py)
    └── NotActive             503 not_active, Retry-After, leader_url (Raft's errors, from_raft)
        └── NotServing        not the active node, draining or stopping (node.py, leader.py)
            └── NoSpace       503 no_space: this node's disk is full (node.py, from_raft)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dex_ha.raft.errors import EntryTooLarge, NotLeader, ProposalDropped
from dex_ha.raft.node import NoSpace as RaftNoSpace

# Seconds a client told to come back (503) waits; the SDKs add jitter and cap their backoff.
RETRY_AFTER_S = "1"


class HttpError(Exception):
    """An error answer: `{"error": code, "message": message, **extra}` with `status` and
    `headers`. The message is the error's `str()` (a subclass may keep parts of it in
    attributes of its own, as InvalidRequest keeps `field`)."""

    def __init__(
        self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.headers: dict[str, str] = dict(headers or {})
        self.extra: dict[str, Any] = extra

    def body(self) -> dict[str, Any]:
        """The JSON body of the answer."""
        return {"error": self.code, "message": str(self), **self.extra}


class ApiError(HttpError):
    """An error a handler decides on itself (404 no such session, 409 stale attempt, …)."""


class StepDownFailed(HttpError):
    """The planned step down could not move the leadership (the message says why): 409."""

    def __init__(self, message: str, status: int = 409, code: str = "step_down_failed") -> None:
        super().__init__(status, code, message)


class UnknownMember(StepDownFailed):
    """The step down names a node that is not another voting member: 404 `not_found`."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=404, code="not_found")


class MemberNotCaughtUp(HttpError):
    """A learner may become a voter only once its log is close to the leader's: a voter
    that lags would count towards quorums it cannot serve (on one node: no quorum at all).
    Answered 409 `conflict`: nothing changed."""

    def __init__(self, message: str) -> None:
        super().__init__(409, "conflict", message)


class Overloaded(HttpError):
    """All request slots are taken: 503 `overloaded` with Retry-After, at once."""

    def __init__(self, message: str) -> None:
        super().__init__(503, "overloaded", message, headers={"Retry-After": RETRY_AFTER_S})


class NotCommitted(HttpError):
    """The active node proposed a write that did not commit (and apply) within
    `proposal_timeout_ms`: 503 `unavailable` with Retry-After. The entry is in the leader's
    log and may still commit later, so this never says the write failed; every write
    carries ids that make sending it again safe (docs/api.md, "Retrying safely")."""

    def __init__(self, timeout_ms: int) -> None:
        super().__init__(
            503,
            "unavailable",
            f"the write was not committed within {timeout_ms / 1000:g} s: fewer than a quorum of the voters "
            "stored it in time (nodes down, stuck or slow; `dex-ha members` shows each one's progress). "
            "It may still commit later: retry it with the same ids (session_id, message_id, task token)",
            headers={"Retry-After": RETRY_AFTER_S},
        )


class NotActive(HttpError):
    """This node cannot serve the request because it is not the active node: 503
    `not_active` with Retry-After. The pipeline adds `leader_url` (the active node's URL
    when this node knows it) to the answer."""

    def __init__(self, why: str) -> None:
        # Our own reasons are sentences about this node already ("this node is draining: …");
        # another layer's (Raft's "not leader") say why in its words.
        message = why if why.startswith("this node ") else f"this node is not the active node ({why})"
        super().__init__(503, "not_active", message, headers={"Retry-After": RETRY_AFTER_S})


class NotServing(NotActive):
    """This node cannot do that now (not the active node, draining, or stopping)."""


class NoSpace(NotServing):
    """This node's disk is full: 503 `no_space` with Retry-After (and `leader_url` when it
    knows another node leads). 503, not 507: the condition passes by itself once space is
    freed, and meanwhile another node takes over the writes, so clients (and the SDKs, and
    proxies) must retry, which they do for a 503 and not for a 507. The message names the
    path and the free bytes."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = "no_space"


def from_raft(exc: NotLeader | ProposalDropped | EntryTooLarge) -> HttpError:
    """The answer to an error of the Raft layer that reached the HTTP API."""
    if isinstance(exc, EntryTooLarge):  # the command would not fit in the replicated log
        return HttpError(413, "too_large", f"body: the command it makes is too large ({exc})")
    if isinstance(exc, RaftNoSpace):
        return NoSpace(f"this node cannot write: {exc}")
    return NotActive(str(exc) or type(exc).__name__)


RAFT_ERRORS = (NotLeader, ProposalDropped, EntryTooLarge)
