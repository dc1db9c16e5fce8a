"""Namespaces in the engine: every session and agent belongs to one, a command names the
caller's, and a session or an agent of another namespace is out of its reach. The rules
are applied from the command alone, so every replica decides the same."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgpack  # type: ignore[import-untyped, unused-ignore]

from dex_ha.engine import (
    AnswerQuestion,
    CancelTurn,
    CreateSession,
    DecideApproval,
    Engine,
    ReconcileToolCall,
    RegisterAgent,
    SendMessage,
    StartQueuedAttempts,
    decode_command,
)
from dex_ha.engine.commands import COMMAND_FORMAT_VERSION
from dex_ha.engine.schema import SCHEMA_VERSION
from tests.engine.driver import AGENT, DEFAULT_TOOLS, UNDO_SCHEMA_4, Driver


def two_tenants() -> Driver:
    """Namespace `a` has agent `helper-a` and session `sa`; `b` has `helper-b` and `sb`,
    each session with a model step queued."""
    d = Driver(":memory:")
    for ns in ("a", "b"):
        d.ok(RegisterAgent(at=d.at, name=f"helper-{ns}", definition={"tools": DEFAULT_TOOLS}, namespace=ns))
        d.ok(CreateSession(at=d.at, session_id=f"s{ns}", agent=f"helper-{ns}", namespace=ns))
        d.ok(SendMessage(at=d.at, session_id=f"s{ns}", text="hi", namespace=ns))
    return d


def test_a_session_of_another_namespace_is_not_found_by_any_command() -> None:
    d = two_tenants()
    at = d.at
    for cmd in (
        SendMessage(at=at, session_id="sb", text="hello", namespace="a"),
        CancelTurn(at=at, session_id="sb", namespace="a"),
        DecideApproval(at=at, session_id="sb", call_id="c1", approved=True, namespace="a"),
        AnswerQuestion(at=at, session_id="sb", question_id="q1", answer="yes", namespace="a"),
        ReconcileToolCall(at=at, session_id="sb", call_id="c1", outcome="succeeded", namespace="a"),
    ):
        result = d.apply(cmd)
        # the same answer as for a session that does not exist: nothing tells that it does
        assert (result.ok, result.code, result.reason) == (False, "not_found", "unknown session sb"), cmd
    assert d.snap("sb")["waiting_messages"] == []  # b's session is untouched
    assert d.apply(CancelTurn(at=at, session_id="sb", namespace="b")).ok


def test_lists_show_only_the_namespace_asked_for() -> None:
    d = two_tenants()
    assert [s["session_id"] for s in d.engine.sessions_page(namespace="a").items] == ["sa"]
    assert [s["namespace"] for s in d.engine.sessions_page().items] == ["a", "b"]
    assert d.snap("sb")["namespace"] == "b"


def test_an_agent_name_belongs_to_one_namespace() -> None:
    d = two_tenants()
    at = d.at
    for cmd, field in (
        (RegisterAgent(at=at, name="helper-b", definition={"tools": []}, namespace="a"), "name"),
        (CreateSession(at=at, session_id="x", agent="helper-b", namespace="a"), "agent"),
    ):
        result = d.apply(cmd)
        assert (result.ok, result.code, result.http_status) == (False, "forbidden", 403)
        assert result.reason == f"{field}: agent 'helper-b' belongs to another namespace"
    # An agent not registered yet is owned by the namespace of its first session.
    d.ok(CreateSession(at=at, session_id="early", agent="later", namespace="b"))
    assert d.apply(RegisterAgent(at=at, name="later", definition={"tools": []}, namespace="a")).code == "forbidden"
    assert d.apply(CreateSession(at=at, session_id="early-a", agent="later", namespace="a")).code == "forbidden"
    d.ok(RegisterAgent(at=at, name="later", definition={"tools": []}, namespace="b"))


def test_a_session_id_taken_in_another_namespace_is_a_conflict() -> None:
    d = two_tenants()
    result = d.apply(CreateSession(at=d.at, session_id="sb", agent="helper-a", namespace="a"))
    assert (result.ok, result.code) == (False, "conflict")
    assert result.reason == "session_id: 'sb' is taken; choose another id"


def test_a_poll_hands_out_only_the_steps_of_its_namespace() -> None:
    d = two_tenants()
    poll = StartQueuedAttempts(
        at=d.at,
        worker_id="w-a",
        term=d.term,
        agents=["helper-b", "helper-a"],
        token_secrets=["x1", "x2"],
        namespace="a",
    )
    started = d.ok(poll).accepted_value().started
    assert [s.session_id for s in started] == ["sa"]
    assert [s.session_id for s in d.engine.queued_steps("helper-b")] == ["sb"]  # b's step still waits


def test_a_worker_may_add_approval_but_not_remove_it() -> None:
    d = Driver(":memory:")
    tools = [{"name": "pay", "effect": "write", "approval": True}, {"name": "look", "effect": "read"}]
    d.ok(RegisterAgent(at=d.at, name=AGENT, definition={"tools": tools}, may_lower_approval=False))
    lowered = [{"name": "pay", "effect": "write"}, {"name": "look", "effect": "read"}]
    removed = [{"name": "look", "effect": "read"}]
    for definition in (lowered, removed):
        result = d.apply(RegisterAgent(at=d.at, name=AGENT, definition={"tools": definition}, may_lower_approval=False))
        assert (result.ok, result.code, result.http_status) == (False, "forbidden", 403)
        assert "tool 'pay' of agent 'helper' needs approval" in result.reason
    more = [{"name": "pay", "effect": "write", "approval": True}, {"name": "look", "effect": "read", "approval": True}]
    added = d.ok(RegisterAgent(at=d.at, name=AGENT, definition={"tools": more}, may_lower_approval=False))
    assert added.accepted_value().policy_changes == [
        {
            "tool": "look",
            "old": {"effect": "read", "approval": False, "inline": False},
            "new": {"effect": "read", "approval": True, "inline": False},
        }
    ]
    by_admin = d.ok(RegisterAgent(at=d.at, name=AGENT, definition={"tools": lowered}))
    assert [
        (c["tool"], c["old"]["approval"], c["new"]["approval"]) for c in by_admin.accepted_value().policy_changes
    ] == [
        ("look", True, False),
        ("pay", True, False),
    ]


def test_an_entry_written_before_namespaces_decodes_in_default() -> None:
    old = msgpack.packb([COMMAND_FORMAT_VERSION, "CreateSession", {"at": 1, "agent": "helper", "session_id": "s1"}])
    assert decode_command(old) == CreateSession(at=1, agent="helper", session_id="s1", namespace="default")
    old = msgpack.packb([COMMAND_FORMAT_VERSION, "RegisterAgent", {"at": 1, "name": "helper", "definition": {}}])
    assert decode_command(old) == RegisterAgent(
        at=1, name="helper", definition={}, namespace="default", may_lower_approval=True
    )


def test_a_schema_3_data_dir_and_snapshot_migrate_to_default(tmp_path: Path) -> None:
    old = tmp_path / "old.db"
    d = Driver(str(old))
    d.register()
    d.create()
    d.send()
    index = d.engine.applied_index()
    d.engine.close()
    conn = sqlite3.connect(old)
    conn.executescript(UNDO_SCHEMA_4)
    conn.close()
    snapshot = old.read_bytes()

    restored = Engine(str(tmp_path / "restored.db"), durable=False)
    restored.restore(snapshot, index)
    d.engine = Engine(str(old), durable=False)  # the data dir itself, reopened
    fresh = Engine(str(tmp_path / "fresh.db"), durable=False)
    for engine in (restored, d.engine):
        assert engine._conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        session = engine.get_agent_snapshot("s1")
        assert session is not None and session["namespace"] == "default"
        assert engine.agent_namespace(AGENT) == "default"
        for table in ("sessions", "agents"):
            columns = f"SELECT name, type, \"notnull\", dflt_value FROM pragma_table_info('{table}') ORDER BY cid"
            assert engine._conn.execute(columns).fetchall() == fresh._conn.execute(columns).fetchall()
    # Commands that name no namespace (as every entry before it) go on reaching the session.
    assert d.send("again").ok
    assert d.apply(SendMessage(at=d.at, session_id="s1", text="x", namespace="a")).code == "not_found"
