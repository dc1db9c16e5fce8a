"""Session events are typed: the engine emits only the dataclasses of dex_ha.session_protocol,
whose types EventType lists, and docs/api.md ("Event types") lists the same types with the
same fields; a committed event reads back the same through the stream's JSON."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from dex_ha.session_protocol import EVENT_CLASSES, TURN_ENDED, Event, EventType, SessionEvent, TurnStarted

REPO = Path(__file__).resolve().parents[2]
ENGINE = REPO / "dex_ha" / "engine"
# A row of the table: | `turn_started` | `turn_id`, `number`, `message_id` | when |
TABLE_ROW = re.compile(r"^\| `([a-z_]+)` \| ([^|]*) \|", re.MULTILINE)


def documented_types() -> dict[str, list[str]]:
    """docs/api.md's event types and the data fields each row names."""
    page = (REPO / "docs" / "api.md").read_text()
    section = page.split("### Event types", 1)[1].split("\n## ", 1)[0]
    return {name: re.findall(r"`([a-z_]+)`", fields) for name, fields in TABLE_ROW.findall(section)}


def test_the_docs_list_every_event_type_with_its_fields() -> None:
    documented = documented_types()
    assert list(documented) == [t.value for t in EventType]
    for event_type, cls in EVENT_CLASSES.items():
        assert documented[event_type] == [f.name for f in dataclasses.fields(cls)], event_type


def test_every_event_type_but_delta_has_its_data_class() -> None:
    # A delta's data is what the Worker sent; every other type is one class, keyed by its type.
    assert set(EVENT_CLASSES) == set(EventType) - {EventType.DELTA}
    assert all(cls.type is event_type for event_type, cls in EVENT_CLASSES.items())
    assert {cls.type for cls in TURN_ENDED.values()} == {
        EventType.TURN_COMPLETED,
        EventType.TURN_FAILED,
        EventType.TURN_CANCELLED,
    }


def emitted_events(path: Path) -> list[tuple[int, str]]:
    """Each `ctx.emit(session_id, event)` of a module: (line, what the event argument is)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "emit":
            assert len(node.args) == 2 and not node.keywords, f"{path.name}:{node.lineno}: emit(session_id, event)"
            found.append((node.lineno, ast.unparse(node.args[1])))
    return found


def test_the_engine_emits_only_typed_events() -> None:
    """No event type as a bare string: each emit builds an event of session_protocol (by its
    class name as `events.Name`, the class a variable holds, or TURN_ENDED). Fails on
    `ctx.emit(sid, "x", **kw)`."""
    names = {cls.__name__ for cls in EVENT_CLASSES.values()} | {"TURN_ENDED"}
    emits = [(path.name, line, arg) for path in sorted(ENGINE.glob("*.py")) for line, arg in emitted_events(path)]
    assert len(emits) >= 20  # every module that emits was read
    for module, line, arg in emits:
        called = arg.split("(", 1)[0].split("[", 1)[0].removeprefix("events.")
        assert called in names or called == "event", f"{module}:{line}: {arg}"


def test_an_event_is_its_fields_in_order_and_reads_back_from_the_stream() -> None:
    event = TurnStarted(turn_id="t1", number=2, message_id="m1")
    assert isinstance(event, Event) and event.type == "turn_started"
    assert list(event.as_json().items()) == [("turn_id", "t1"), ("number", 2), ("message_id", "m1")]
    stored = SessionEvent.committed("65537", event.type.value, event.as_json(), 1_700_000_000_000)
    assert stored.event_id == 65537
    wire = stored.as_json()
    assert wire == {"id": "65537", "type": "turn_started", "at": 1_700_000_000_000, "data": event.as_json()}
    assert SessionEvent.from_json("65537", "turn_started", wire) == stored
