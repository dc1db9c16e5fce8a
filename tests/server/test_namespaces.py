"""Namespaces over HTTP: a token limited to namespace A neither sees nor reaches B's
sessions (404, the answer for a session that does not exist), a Worker token of A neither
registers B's agents nor gets B's tasks, only an admin lowers a tool's approval (and each
policy change is logged), and the tokens of `[tokens]` go on using every namespace."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from dex_ha.client import DexClient, DexError
from dex_ha.server.auth import ScopedToken
from dex_ha.server.config import ConfigError, load_config
from dex_ha.server.node import NodeServer
from dex_ha.worker import Agent, ScriptedModel, Worker
from harness.waiting import eventually
from tests.e2e.conftest import running
from tests.server.node_fixture import (
    HttpApi,
    Reply,
    assert_error,
    expect,
    model_result,
    single_node_config,
    tool,
    tool_call,
)

CLIENT_A = "client-token-of-namespace-a-0123"
CLIENT_B = "client-token-of-namespace-b-0123"
WORKER_A = "worker-token-of-namespace-a-0123"
WORKER_B = "worker-token-of-namespace-b-0123"
SCOPED = (
    ScopedToken("client", ("ns-a",), CLIENT_A),
    ScopedToken("client", ("ns-b",), CLIENT_B),
    ScopedToken("worker", ("ns-a",), WORKER_A),
    ScopedToken("worker", ("ns-b",), WORKER_B),
)


def bearer(token: str, namespace: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}"}
    if namespace is not None:
        headers["Dex-Namespace"] = namespace
    return headers


@pytest.fixture
async def scoped_node(nodes, tmp_path: Path) -> NodeServer:
    return await nodes(single_node_config(tmp_path / "node", scoped_tokens=SCOPED))


@pytest.fixture
async def scoped_api(scoped_node: NodeServer, http) -> HttpApi:
    """A node with the usual tokens of every role (every namespace) and tokens limited to
    ns-a or ns-b; ns-b has agent agent-b and session sb, with a model step queued."""
    api = http(scoped_node)
    expect(await api.call("PUT", "/v1/agents/agent-b", json_body={"tools": []}, headers=bearer(WORKER_B)), 200)
    body = {"agent": "agent-b", "session_id": "sb"}
    created = expect(await api.call("POST", "/v1/sessions", json_body=body, headers=bearer(CLIENT_B)), 201)
    assert created["namespace"] == "ns-b"
    expect(await api.call("POST", "/v1/sessions/sb/messages", json_body={"text": "hi"}, headers=bearer(CLIENT_B)), 202)
    return api


async def as_client_a(api: HttpApi, method: str, path: str, body: object = None) -> Reply:
    return await api.call(method, path, json_body=body, headers=bearer(CLIENT_A))


@pytest.mark.covers("get_session", "list_sessions")
async def test_a_client_token_of_a_gets_404_for_bs_sessions_and_never_lists_them(scoped_api: HttpApi) -> None:
    api = scoped_api
    for method, path, body in (
        ("GET", "/v1/sessions/sb", None),
        ("GET", "/v1/sessions/sb/events", None),
        ("POST", "/v1/sessions/sb/messages", {"text": "let me in"}),
        ("POST", "/v1/sessions/sb/cancel", {}),
        ("POST", "/v1/sessions/sb/approvals/c1", {"approved": True}),
        ("POST", "/v1/sessions/sb/questions/q1/answer", {"answer": "yes"}),
        ("POST", "/v1/sessions/sb/tool-calls/c1/reconcile", {"outcome": "succeeded"}),
    ):
        reply = await as_client_a(api, method, path, body)
        assert_error(reply, 404, "not_found")
        assert "no session 'sb'" in reply.error_message() or "unknown session sb" in reply.error_message()
    listed = expect(await as_client_a(api, "GET", "/v1/sessions"), 200)
    assert listed["sessions"] == []
    # Naming B's namespace does not help: the token may not use it.
    reply = await api.call("GET", "/v1/sessions/sb", headers=bearer(CLIENT_A, "ns-b"))
    assert_error(reply, 403, "forbidden", names="ns-b")
    # B's own token sees its session, and its message was not joined by A's.
    snapshot = expect(await api.call("GET", "/v1/sessions/sb", headers=bearer(CLIENT_B)), 200)
    assert "let me in" not in json.dumps(snapshot) and snapshot["namespace"] == "ns-b"
    listed = expect(await api.call("GET", "/v1/sessions", headers=bearer(CLIENT_B)), 200)
    assert [s["session_id"] for s in listed["sessions"]] == ["sb"]


@pytest.mark.covers("list_sessions", "get_session")
async def test_tokens_of_the_tokens_table_use_every_namespace_and_default_when_none_is_named(
    scoped_api: HttpApi,
) -> None:
    api = scoped_api
    assert expect(await api.get("/v1/sessions"), 200)["sessions"] == []  # `default` holds none
    assert_error(await api.get("/v1/sessions/sb"), 404, "not_found", names="default")
    in_b = {"Dex-Namespace": "ns-b"}
    assert expect(await api.get("/v1/sessions/sb", headers=in_b), 200)["namespace"] == "ns-b"
    assert expect(await api.get("/v1/sessions/sb", role="admin", headers=in_b), 200)["session_id"] == "sb"
    await api.register_agent("agent-d", [])
    created = await api.create_session("agent-d", "sd")  # no namespace named: default, as before
    assert created["namespace"] == "default"
    assert_error(await api.get("/v1/sessions", headers={"Dex-Namespace": ".."}), 400, "invalid", names="Dex-Namespace")


@pytest.mark.covers("register_agent", "worker_poll")
async def test_a_worker_token_of_a_cannot_register_bs_agent_and_never_gets_bs_tasks(
    scoped_node: NodeServer, scoped_api: HttpApi
) -> None:
    api = scoped_api
    reply = await api.call("PUT", "/v1/agents/agent-b", json_body={"tools": []}, headers=bearer(WORKER_A))
    assert_error(reply, 403, "forbidden", names="agent-b")
    poll = {"worker_id": "w-a", "agents": ["agent-b"], "max_tasks": 1, "wait_ms": 0}
    reply = await api.call("POST", "/v1/worker/poll", json_body=poll, headers=bearer(WORKER_A))
    assert_error(reply, 403, "forbidden", names="agent-b")

    # A poll of A for a name nobody uses yet; B then starts a session of that name: its
    # step is queued while A's poll waits, and A's poll still gets nothing.
    expect(await api.call("PUT", "/v1/agents/agent-a", json_body={"tools": []}, headers=bearer(WORKER_A)), 200)
    poll = {"worker_id": "w-a", "agents": ["agent-a", "later"], "max_tasks": 4, "wait_ms": 1500}
    waiting = asyncio.create_task(api.call("POST", "/v1/worker/poll", json_body=poll, headers=bearer(WORKER_A)))
    leader = scoped_node.leader
    await eventually(lambda: leader is not None and leader.waiting_polls() == 1, what="A's poll to wait", deadline_s=5)
    body = {"agent": "later", "session_id": "sl"}
    expect(await api.call("POST", "/v1/sessions", json_body=body, headers=bearer(CLIENT_B)), 201)
    expect(await api.call("POST", "/v1/sessions/sl/messages", json_body={"text": "x"}, headers=bearer(CLIENT_B)), 202)
    assert expect(await waiting, 200)["tasks"] == []

    poll = {"worker_id": "w-b", "agents": ["agent-b", "later"], "max_tasks": 4, "wait_ms": 5000}
    tasks = expect(await api.call("POST", "/v1/worker/poll", json_body=poll, headers=bearer(WORKER_B)), 200)["tasks"]
    assert sorted(t["session_id"] for t in tasks) == ["sb", "sl"]


@pytest.mark.covers("register_agent")
async def test_a_worker_may_add_approval_but_only_an_admin_removes_it_and_each_change_is_logged(
    scoped_api: HttpApi, caplog: pytest.LogCaptureFixture
) -> None:
    api = scoped_api
    caplog.set_level(logging.INFO, logger="dex_ha.server.http")
    await api.register_agent("payer", [tool("pay", "write"), tool("look")])
    await api.register_agent("payer", [tool("pay", "write", approval=True), tool("look")])  # adding: a Worker may
    reply = await api.put("/v1/agents/payer", {"tools": [tool("pay", "write"), tool("look")]})
    assert_error(reply, 403, "forbidden", names="'pay'")
    reply = await api.put("/v1/agents/payer", {"tools": [tool("look")]})  # removing the tool is lowering too
    assert_error(reply, 403, "forbidden", names="'pay'")
    lowered = expect(
        await api.put("/v1/agents/payer", {"tools": [tool("pay", "write"), tool("look")]}, role="admin"), 200
    )
    assert lowered["version"] == 3
    lines = [r.getMessage() for r in caplog.records if "policy" in r.getMessage()]
    assert any("'payer'" in line and "'pay'" in line and "role worker" in line for line in lines), lines
    admin_line = next(line for line in lines if "role admin" in line)
    assert "'pay'" in admin_line and '"approval":true' in admin_line.split("->")[0], admin_line
    assert '"approval":false' in admin_line.split("->")[1], admin_line


@pytest.mark.covers("decide_approval")
async def test_an_approval_reaches_only_the_sessions_of_the_callers_namespace(scoped_api: HttpApi) -> None:
    api = scoped_api
    in_b = {"Dex-Namespace": "ns-b"}
    expect(await api.put("/v1/agents/agent-b", {"tools": [tool("pay", "write", approval=True)]}, headers=in_b), 200)
    poll = {"worker_id": "w-b", "agents": ["agent-b"], "max_tasks": 1, "wait_ms": 5000}
    [task] = expect(await api.call("POST", "/v1/worker/poll", json_body=poll, headers=bearer(WORKER_B)), 200)["tasks"]
    done = {"worker_id": "w-b", "result": model_result("paying", [tool_call("c1", "pay")])}
    path = f"/v1/worker/tasks/{task['task_token']}/complete"
    expect(await api.call("POST", path, json_body=done, headers=bearer(WORKER_B)), 200)
    assert_error(await as_client_a(api, "POST", "/v1/sessions/sb/approvals/c1", {"approved": True}), 404)
    approve = await api.call(
        "POST", "/v1/sessions/sb/approvals/c1", json_body={"approved": True}, headers=bearer(CLIENT_B)
    )
    assert expect(approve, 200)["approved"] is True


def test_scoped_tokens_come_from_the_file_and_the_environment(tmp_path: Path) -> None:
    config_file = tmp_path / "node.toml"
    config_file.write_text(
        f"""
node_id = "n1"
data_dir = "{tmp_path / "data"}"
http_listen = "127.0.0.1:8801"
raft_listen = "127.0.0.1:9801"
cluster_secret = "cluster-secret-0123456789"
join = true

[tokens]
admin = ["admin-token-0123456789"]

[[scoped_tokens]]
role = "client"
namespaces = ["team-a", "team-b"]
value = "{CLIENT_A}"
"""
    )
    env = {"DEX_HA_SCOPED_TOKENS": f"worker:team-a={WORKER_A},client:team.c+d=tok=with=equals-0123"}
    config = load_config(config_file, env)
    assert config.scoped_tokens == (
        ScopedToken("client", ("team-a", "team-b"), CLIENT_A),
        ScopedToken("worker", ("team-a",), WORKER_A),
        ScopedToken("client", ("team.c", "d"), "tok=with=equals-0123"),
    )
    assert CLIENT_A not in repr(config.scoped_tokens)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ("admin:team-a=admin-scoped-token-0123", "role"),
        ("client:..=client-scoped-token-0123", "namespaces"),
        ("client=client-scoped-token-0123", "DEX_HA_SCOPED_TOKENS"),
    ],
)
def test_a_bad_scoped_token_is_refused_naming_the_key(tmp_path: Path, env: str, named: str) -> None:
    base = {
        "DEX_HA_NODE_ID": "n1",
        "DEX_HA_DATA_DIR": str(tmp_path),
        "DEX_HA_HTTP_LISTEN": "127.0.0.1:8801",
        "DEX_HA_RAFT_LISTEN": "127.0.0.1:9801",
        "DEX_HA_JOIN": "true",
    }
    with pytest.raises(ConfigError) as caught:
        load_config(None, {**base, "DEX_HA_SCOPED_TOKENS": env}, insecure=True)
    assert named in str(caught.value)


async def test_the_sdks_work_in_the_namespace_they_are_given(scoped_node: NodeServer, scoped_api: HttpApi) -> None:
    """DexClient and Worker with namespace ns-a (and the tokens of ns-a): the Worker serves
    ns-a's agent, the client sees ns-a's sessions only; B's session stays out of reach."""
    url = scoped_api.url
    agent = Agent("agent-sdk", model=ScriptedModel([{"content": "hello from ns-a"}]))
    worker = Worker(url, WORKER_A, agents=[agent], namespace="ns-a", poll_wait_ms=500)
    async with running(worker), DexClient(url, CLIENT_A, namespace="ns-a", give_up_after_s=5) as client:
        session = await client.create_session("agent-sdk", session_id="s-sdk")
        assert session.namespace == "ns-a"
        await client.send_message("s-sdk", "hi")
        done = await client.wait_until_idle("s-sdk", timeout_s=10)
        assert done.history[-1]["content"] == "hello from ns-a"
        assert [s.session_id for s in (await client.list_sessions()).sessions] == ["s-sdk"]
        with pytest.raises(DexError) as caught:
            await client.get_session("sb")
        assert caught.value.status == 404
    assert scoped_node.replica.reads.agent_namespace("agent-sdk") == "ns-a"
