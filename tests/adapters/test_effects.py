"""The shared part of the adapters: effect declarations, their default, tool_context(), and
a tool's output as JSON."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from dex_ha.adapters import DEFAULT_EFFECT, effect, tool_context
from dex_ha.adapters._common import declared_effect, json_output, resolve_effects, running_tool
from dex_ha.worker import ToolContext


def make_ctx(call_id: str = "c1") -> ToolContext:
    return ToolContext(
        session_id="s1",
        turn_id="t1",
        step_id="st1",
        call_id=call_id,
        attempt=1,
        idempotency_key=f"s1:{call_id}",
        worker_id="w1",
    )


def test_the_default_effect_is_write() -> None:
    assert DEFAULT_EFFECT == "write"
    assert resolve_effects({"a": None, "b": "read"}, None) == {"a": "write", "b": "read"}


def test_the_mapping_and_the_decorator_each_declare_an_effect() -> None:
    assert resolve_effects(
        {"a": None, "b": "read", "c": "idempotent_write"}, {"a": "idempotent_write", "b": "read"}
    ) == {"a": "idempotent_write", "b": "read", "c": "idempotent_write"}


def test_an_unknown_tool_in_the_mapping_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"'lookpu' is not a function tool of this agent \(its tools: lookup\)"):
        resolve_effects({"lookup": None}, {"lookpu": "read"})


def test_an_unknown_effect_is_refused_naming_the_tool() -> None:
    with pytest.raises(ValueError, match=r"effects\['lookup'\]: the effect must be one of"):
        resolve_effects({"lookup": None}, {"lookup": "safe"})


def test_two_declarations_that_disagree_are_refused_naming_the_tool() -> None:
    with pytest.raises(ValueError, match=r"effects\['refund'\]: 'read' contradicts @effect\('write'\)"):
        resolve_effects({"refund": "write"}, {"refund": "read"})


def test_effects_must_be_a_mapping() -> None:
    with pytest.raises(TypeError, match="effects must be a dict"):
        resolve_effects({"a": None}, [("a", "read")])  # type: ignore[arg-type]


def test_the_decorator_refuses_an_unknown_effect_and_marks_what_it_decorates() -> None:
    with pytest.raises(ValueError, match="kind: the effect must be one of read, idempotent_write, write"):
        effect("safe")

    @effect("read")
    def lookup() -> None: ...

    assert declared_effect(None, lookup) == "read"
    assert declared_effect(object(), None) is None


async def test_tool_context_is_the_running_steps_own_even_in_a_thread() -> None:
    with pytest.raises(RuntimeError, match="only available inside a tool"):
        tool_context()

    async def run(call_id: str) -> tuple[str | None, str | None]:
        with running_tool(make_ctx(call_id)):
            await asyncio.sleep(0.01)  # the other step's tool runs meanwhile
            in_thread = await asyncio.to_thread(lambda: tool_context().idempotency_key)
            return tool_context().idempotency_key, in_thread

    assert await asyncio.gather(run("a"), run("b")) == [("s1:a", "s1:a"), ("s1:b", "s1:b")]
    with pytest.raises(RuntimeError):
        tool_context()


def test_a_tools_output_becomes_json() -> None:
    @dataclasses.dataclass
    class Order:
        order_id: str
        tags: tuple[str, ...]

    class Opaque:
        def __str__(self) -> str:
            return "opaque!"

    assert json_output({"order": Order("A17", ("x",)), "n": 1, "other": Opaque()}) == {
        "order": {"order_id": "A17", "tags": ["x"]},
        "n": 1,
        "other": "opaque!",
    }
    assert json_output("text") == "text"


def test_the_package_imports_no_framework() -> None:
    import subprocess
    import sys

    code = (
        "import sys, dex_ha.adapters, dex_ha.worker; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('agents', 'pydantic_ai', 'openai')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
