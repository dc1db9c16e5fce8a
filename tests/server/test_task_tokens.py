"""Task tokens and task ownership: a task token is unguessable, and only the
Worker that polled a task may heartbeat, complete or fail it.

- Another Worker (another worker_id, with a valid worker token) is refused with 403
  `forbidden` naming worker_id, and changes nothing: the session keeps the owner's answer.
- A token that was not handed out is 404 `not_found`: the guessable `{step}-{attempt}-{term}`
  of earlier versions, the right numbers with a made-up secret, the real secret moved to
  another attempt, and numbers too large for SQLite (once a 500).

Forged tokens are built from what a Worker sees anyway (the task's step_id and attempt,
the cluster's term) in the format of dex_ha.server.task_tokens; Workers treat tokens as
opaque.
"""

from __future__ import annotations

from typing import Any

import pytest

from dex_ha.server.task_tokens import TaskToken, new_token_secret
from tests.server.node_fixture import HttpApi, assert_error, expect, model_result

OWNER, OTHER = "worker-a", "worker-b"
MADE_UP_SECRET = "0123456789abcdef" * 2
TOO_LARGE = 2**63  # one past SQLite's largest integer

covers = pytest.mark.covers


async def owned_task(api: HttpApi, session_id: str = "s1") -> dict[str, Any]:
    """A RunModel task handed to OWNER."""
    await api.register_agent("helper", [])
    await api.create_session("helper", session_id)
    await api.send_message(session_id, "hello")
    return await api.poll_one("helper", worker_id=OWNER)


async def report(api: HttpApi, token: str, action: str, worker_id: str, **body: Any) -> Any:
    return await api.post(f"/v1/worker/tasks/{token}/{action}", {"worker_id": worker_id, **body}, role="worker")


REPORTS: dict[str, dict[str, Any]] = {  # action -> the rest of a valid JSON body
    "heartbeat": {"deltas": [{"text": "forged"}]},
    "complete": {"result": model_result("the other Worker's answer")},
    "fail": {"error": "the other Worker says it failed", "retryable": False},
}


@covers("task_heartbeat", "task_complete", "task_fail")
async def test_another_worker_cannot_report_on_a_task_it_did_not_take(api: HttpApi) -> None:
    task = await owned_task(api)
    before = await api.snapshot("s1")
    for action, body in REPORTS.items():
        reply = await report(api, task["task_token"], action, OTHER, **body)
        assert_error(reply, 403, "forbidden", names="worker_id")
    assert await api.snapshot("s1") == before  # nothing changed

    # The owner's reports are accepted, and the session takes the owner's answer.
    assert expect(await report(api, task["task_token"], "heartbeat", OWNER), 200) == {"cancel": False}
    await api.complete(task, model_result("the owner's answer"), worker_id=OWNER)
    after = await api.snapshot("s1")
    assert after["history"][-1]["content"] == "the owner's answer"
    assert after["turns"][-1]["status"] == "completed"
    # Still another Worker's task after it completed: 403, not the owner's 200 or 409.
    assert_error(
        await report(api, task["task_token"], "complete", OTHER, **REPORTS["complete"]),
        403,
        "forbidden",
        names="worker_id",
    )


async def test_a_task_handed_out_eagerly_belongs_to_the_worker_that_completed_the_step(api: HttpApi) -> None:
    await api.register_agent("helper", [{"name": "lookup", "effect": "read"}])
    await api.create_session("helper", "s1")
    await api.send_message("s1", "look it up")
    task = await api.poll_one("helper", worker_id=OWNER)
    result = model_result("on it", [{"id": "c1", "name": "lookup", "arguments": {}}])
    [eager] = expect(await report(api, task["task_token"], "complete", OWNER, result=result, next_tasks=1), 200)[
        "tasks"
    ]
    assert_error(await report(api, eager["task_token"], "heartbeat", OTHER), 403, "forbidden", names="worker_id")
    assert expect(await report(api, eager["task_token"], "heartbeat", OWNER), 200) == {"cancel": False}


def forged_tokens(task: dict[str, Any], term: int) -> dict[str, str]:
    step_id, attempt = task["step_id"], task["attempt"]
    secret = task["task_token"].rsplit("-", 1)[-1]
    return {
        "the guessable format of earlier versions": f"{step_id}-{attempt}-{term}",
        "the right numbers with a made-up secret": f"{step_id}-{attempt}-{term}-{MADE_UP_SECRET}",
        "the real secret on another attempt": f"{step_id}-{attempt + 1}-{term}-{secret}",
        "an attempt number too large for SQLite": f"{step_id}-{TOO_LARGE}-{term}-{MADE_UP_SECRET}",
        "a term too large for SQLite": f"{step_id}-{attempt}-{10**30}-{MADE_UP_SECRET}",
        "an old-format token with a huge attempt": f"st1-{TOO_LARGE}-1",
        "non-ASCII digits": f"{step_id}-\u0661-{term}-{MADE_UP_SECRET}",
    }


@covers("task_heartbeat", "task_complete", "task_fail")
async def test_a_token_that_was_not_handed_out_is_404(api: HttpApi) -> None:
    task = await owned_task(api)
    term = expect(await api.get("/v1/cluster"), 200)["term"]
    before = await api.snapshot("s1")
    problems = []
    for what, token in forged_tokens(task, term).items():
        for action, body in REPORTS.items():
            reply = await report(api, token, action, OWNER, **body)
            if reply.status != 404 or reply.error_code() != "not_found":
                problems.append(f"{what} ({token}), {action}: {reply.status} {reply.body}")
    assert not problems, "\n".join(problems)
    assert await api.snapshot("s1") == before  # nothing changed
    await api.complete(task, model_result("done"), worker_id=OWNER)  # the real token still works


def test_a_token_parses_back_and_malformed_ones_do_not_parse() -> None:
    token = TaskToken("st12.3", 2, 7, new_token_secret())
    assert TaskToken.parse(str(token)) == token
    dashed = TaskToken.parse(str(TaskToken("st-with-dashes", 1, 1, MADE_UP_SECRET)))
    assert dashed is not None and dashed.step_id == "st-with-dashes"
    for text in (
        "st12.3-2-7",
        f"-2-7-{MADE_UP_SECRET}",
        f"st1-2-7-{MADE_UP_SECRET.upper()}",
        f"st1-2-7-{MADE_UP_SECRET}0",
        f"st1-{'9' * 19}-7-{MADE_UP_SECRET}",
        f"st1-+2-7-{MADE_UP_SECRET}",
        f"st1-2-7-{MADE_UP_SECRET}\n",
        "",
    ):
        assert TaskToken.parse(text) is None, text
    assert new_token_secret() != new_token_secret()
