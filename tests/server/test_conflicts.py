"""A repeated request that contradicts what was recorded is answered, never accepted in
silence: 409 `conflict` naming the field (the engine decides, when the command applies, so
the answer is the same on every node and after a failover), and 400 for a JSON key given
twice. Ids of new sessions and agents keep to a documented character set."""

from __future__ import annotations

import pytest

from tests.server.node_fixture import HttpApi, assert_error, expect, tool


@pytest.mark.covers("create_session")
async def test_the_same_session_id_with_other_metadata_is_409_naming_metadata(api: HttpApi):
    """Before: 200 with the old metadata, and the caller never knew."""
    first = {"agent": "a", "session_id": "s1", "metadata": {"ticket": 1, "team": "x"}}
    expect(await api.post("/v1/sessions", first), 201)
    reply = await api.post("/v1/sessions", {**first, "metadata": {"ticket": 2, "team": "x"}})
    assert_error(reply, 409, "conflict", names="metadata")
    assert (await api.snapshot("s1"))["metadata"] == {"ticket": 1, "team": "x"}


@pytest.mark.covers("create_session")
async def test_the_same_session_again_is_200_and_omitted_metadata_matches_any(api: HttpApi):
    first = {"agent": "a", "session_id": "s1", "metadata": {"ticket": 1, "team": "x"}}
    expect(await api.post("/v1/sessions", first), 201)
    expect(await api.post("/v1/sessions", {**first, "metadata": {"team": "x", "ticket": 1}}), 200)  # key order
    expect(await api.post("/v1/sessions", {"agent": "a", "session_id": "s1"}), 200)
    expect(await api.post("/v1/sessions", {"agent": "a", "session_id": "s1", "metadata": None}), 200)
    expect(await api.post("/v1/sessions", {"agent": "a", "session_id": "s2"}), 201)
    assert_error(await api.post("/v1/sessions", {"agent": "a", "session_id": "s2", "metadata": {}}), 409, "conflict")
    assert_error(await api.post("/v1/sessions", {"agent": "b", "session_id": "s1"}), 409, "conflict", names="agent")


@pytest.mark.covers("send_message")
async def test_the_same_message_id_with_another_mode_or_text_is_409_naming_the_field(api: HttpApi):
    """Before: another mode counted as a duplicate (202)."""
    await api.register_agent("a", [tool("lookup")])
    await api.create_session("a", "s1")
    path = "/v1/sessions/s1/messages"
    expect(await api.post(path, {"text": "hi", "message_id": "m1", "mode": "queue"}), 202)
    assert_error(await api.post(path, {"text": "hi", "message_id": "m1", "mode": "steer"}), 409, "conflict", "mode")
    assert_error(await api.post(path, {"text": "ho", "message_id": "m1", "mode": "queue"}), 409, "conflict", "text")
    again = expect(await api.post(path, {"text": "hi", "message_id": "m1"}), 202)  # mode defaults to queue
    assert again["duplicate"] is True


@pytest.mark.parametrize(
    ("path", "raw", "key"),
    [
        ("/v1/sessions", '{"agent": "a", "session_id": "s1", "agent": "b"}', "agent"),
        ("/v1/sessions", '{"agent": "a", "metadata": {"role": "user", "role": "admin"}}', "role"),
        ("/v1/sessions/s1/approvals/c1", '{"approved": false, "approved": true}', "approved"),
    ],
)
async def test_a_json_key_given_twice_is_400_naming_it(api: HttpApi, path: str, raw: str, key: str):
    """Before: the last one won, where another reader of the same bytes may take the first."""
    reply = await api.call("POST", path, role="client", data=raw.encode(), headers={"Content-Type": "application/json"})
    assert_error(reply, 400, "invalid", names=f"{key}: is given twice")
    assert_error(await api.get("/v1/sessions/s1"), 404, "not_found")


@pytest.mark.parametrize("session_id", [".", "..", "-rf", "a b", "a%2Fb", "é"])
async def test_a_session_id_outside_the_character_set_is_400(api: HttpApi, session_id: str):
    """Before: `.` and `..` were created, and no SDK or browser could address them."""
    reply = await api.post("/v1/sessions", {"agent": "a", "session_id": session_id})
    assert_error(reply, 400, "invalid", names="session_id: must start with a letter or digit")


async def test_an_agent_name_outside_the_character_set_is_400(api: HttpApi):
    assert_error(await api.put("/v1/agents/..x", {"tools": []}), 400, "invalid", names="name: must start")
    assert_error(await api.post("/v1/sessions", {"agent": ".."}), 400, "invalid", names="agent: must start")
