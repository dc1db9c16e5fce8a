"""The HTTP error hierarchy (dex_ha/server/errors.py): every error the API answers is an
HttpError that carries its status, code, headers and body, Raft's errors map onto it, and
the HTTP app does not import the node module at run time (no import circle)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dex_ha.raft.errors import EntryTooLarge, NotLeader, ProposalDropped
from dex_ha.server.admission import Admission
from dex_ha.server.auth import AuthError
from dex_ha.server.errors import (
    ApiError,
    HttpError,
    MemberNotCaughtUp,
    NotActive,
    NotCommitted,
    NotServing,
    Overloaded,
    StepDownFailed,
    UnknownMember,
    from_raft,
)
from dex_ha.server.http_limits import BodyTimeout
from dex_ha.server.validation import BodyTooLarge, InvalidRequest


@pytest.mark.parametrize(
    "error,status,code",
    [
        (ApiError(404, "not_found", "no session 's1'"), 404, "not_found"),
        (InvalidRequest("limit", "must be at least 1"), 400, "invalid"),
        (AuthError(401, "a bearer token is required"), 401, "unauthorized"),
        (AuthError(403, "needs the admin role"), 403, "forbidden"),
        (UnknownMember("'n9' is not another voting member"), 404, "not_found"),
        (BodyTimeout("body: did not arrive within 5 s"), 408, "request_timeout"),
        (StepDownFailed("no other voter to hand the leadership to"), 409, "step_down_failed"),
        (MemberNotCaughtUp("learner 'n4' is not caught up"), 409, "conflict"),
        (BodyTooLarge(100, 101), 413, "too_large"),
        (Overloaded("node n1 is at its bound"), 503, "overloaded"),
        (NotCommitted(5000), 503, "unavailable"),
        (NotServing("this node is draining: it hands out no new work"), 503, "not_active"),
    ],
)
def test_every_api_error_is_an_http_error_with_its_status_and_code(error: Exception, status: int, code: str) -> None:
    assert isinstance(error, HttpError)
    assert (error.status, error.code) == (status, code)
    assert error.body() == {"error": code, "message": str(error)}


def test_an_invalid_request_names_the_field_in_its_message_and_keeps_both_parts() -> None:
    error = InvalidRequest("limit", "must be at least 1")
    assert str(error) == "limit: must be at least 1" == error.body()["message"]
    assert (error.field, error.message) == ("limit", "must be at least 1")


def test_the_answers_that_tell_a_client_to_come_back_carry_their_headers() -> None:
    assert Overloaded("busy").headers == {"Retry-After": "1"}
    assert NotServing("this node is not the active node").headers == {"Retry-After": "1"}
    assert NotCommitted(5000).headers == {"Retry-After": "1"}


def test_a_write_not_committed_in_time_says_it_may_still_commit_and_how_to_retry() -> None:
    message = str(NotCommitted(5000))
    assert "not committed within 5 s" in message and "may still commit" in message
    assert "same ids" in message and "failed" not in message
    assert AuthError(401, "no token").headers == {"WWW-Authenticate": 'Bearer realm="dex-ha"'}
    assert AuthError(403, "wrong role").headers == {}


def test_extra_fields_go_into_the_body() -> None:
    error = ApiError(409, "conflict", "taken", holder="n2")
    assert error.body() == {"error": "conflict", "message": "taken", "holder": "n2"}


def test_a_not_active_message_is_a_sentence_about_this_node() -> None:
    assert (
        str(NotServing("this node is draining: it hands out no new work"))
        == "this node is draining: it hands out no new work"
    )
    assert (
        str(NotServing("the hand-out was not committed; poll again"))
        == "this node is not the active node (the hand-out was not committed; poll again)"
    )


def test_raft_errors_become_not_active_or_too_large() -> None:
    not_leader = from_raft(NotLeader("n2"))
    assert isinstance(not_leader, NotActive) and not_leader.status == 503
    assert str(not_leader).startswith("this node is not the active node (")
    dropped = from_raft(ProposalDropped())
    assert isinstance(dropped, NotActive) and "ProposalDropped" in str(dropped)
    too_large = from_raft(EntryTooLarge(9_000_000, 8 << 20))
    assert (too_large.status, too_large.code) == (413, "too_large")
    assert (
        str(too_large)
        == "body: the command it makes is too large (entry of 9000000 bytes is above the limit of 8388608 bytes)"
    )


def test_the_admission_bound_says_which_node_sheds() -> None:
    admission = Admission(1, "node n7")
    with admission.slot(bounded=True), pytest.raises(Overloaded) as caught, admission.slot(bounded=True):
        pass
    assert str(caught.value).startswith("node n7 is at its bound of 1 requests in flight")
    assert admission.shed_total == 1


def test_the_http_app_does_not_import_the_node_module() -> None:
    """node.py builds the app; the app names NodeServer only for the type checker."""
    probe = (
        "import sys, dex_ha.server.app; "
        "assert 'dex_ha.server.node' not in sys.modules, 'app imports node'; "
        "import dex_ha.server.node"
    )
    done = subprocess.run([sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
