"""The JSON encoder of the node's answers: orjson when installed, the stdlib otherwise;
either way the same JSON value reaches the client."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dex_ha.server import app

ANSWERS: list[Any] = [
    {"step_id": "s1", "attempt": 1, "status": "completed", "tasks": []},
    {"text": "héllo ✓ 😀", "nested": [{"a": None, "b": True, "c": 1.5, "d": -3}]},
    {1: "an int key", "k": [1, 2, 3]},  # keys become strings, as the stdlib writes them
    {"big": 2**70},  # past 64 bits: orjson refuses it, so the stdlib writes it
    [],
]


@pytest.mark.parametrize("answer", ANSWERS, ids=range(len(ANSWERS)))
def test_an_answer_decodes_to_what_the_stdlib_would_have_written(answer: Any) -> None:
    assert json.loads(app._dumps(answer)) == json.loads(app._stdlib_dumps(answer))


def test_the_answers_use_orjson_when_it_is_installed() -> None:
    pytest.importorskip("orjson")
    assert app._dumps is not app._stdlib_dumps
    assert app._dumps({"a": [1, "é"]}) == '{"a":[1,"é"]}'  # compact and not ASCII-escaped, as before
