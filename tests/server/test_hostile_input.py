"""Hostile input over raw HTTP: no request gets a 500 or a non-JSON answer, and one
Worker's bad poll cannot stop the dispatch of everyone else's steps.

Each case here was a 500, a text/plain answer or a stalled dispatch before the fix that
came with it (see the git log of this file).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest

from dex_ha.server.node import NodeServer
from dex_ha.server.validation import InvalidRequest
from tests.server.node_fixture import (
    ClusterPlan, HttpApi, assert_error, expect, wait_until,
)

TOKEN_PATH = "/v1/worker/tasks/st999-1-1"
DEADLINE_S = 5.0


# ---------------------------------------------------------------- values the Raft log cannot carry

# JSON text for values that JSON allows but msgpack (the Raft log) or Python cannot take.
ABOVE_UINT64 = str(2**64)
BELOW_INT64 = str(-(2**63) - 1)
FIVE_THOUSAND_DIGITS = "9" * 5000  # over Python's int-string conversion limit (4300 digits)
LONE_SURROGATE = '"\\ud800"'

# (method, path, role, body with {v} where the value goes, the field the message must name)
FREE_FORM_PLACES = [
    ("POST", "/v1/sessions", "client", '{"agent": "a", "metadata": {"k": {v}}}', "metadata.k"),
    ("POST", f"{TOKEN_PATH}/complete", "worker", '{"result": {"status": "ok", "output": [1, {v}]}}',
     "result.output[1]"),
    ("POST", "/v1/sessions/s1/questions/q1/answer", "client", '{"answer": {"choice": {v}}}', "answer.choice"),
    ("POST", "/v1/sessions/s1/tool-calls/c1/reconcile", "client", '{"outcome": "succeeded", "result": {v}}',
     "result"),
    ("PUT", "/v1/agents/a", "worker", '{"tools": [], "metadata": {"k": {v}}}', "metadata.k"),
    ("PUT", "/v1/agents/a", "worker", '{"tools": [{"name": "t", "effect": "read", "max_attempts": {v}}]}',
     "tools[0].max_attempts"),
]
INTEGERS = {"above_uint64": ABOVE_UINT64, "below_int64": BELOW_INT64, "5000_digits": FIVE_THOUSAND_DIGITS}


async def send_raw(api: HttpApi, method: str, path: str, role: str, body: str) -> Any:
    return await api.call(method, path, role=role, data=body.encode(), headers={"Content-Type": "application/json"})


def place_id(place: tuple[str, ...]) -> str:
    return f"{place[0]} {place[1]} {place[4]}"


@pytest.mark.parametrize("value", INTEGERS.values(), ids=INTEGERS.keys())
@pytest.mark.parametrize(("method", "path", "role", "template", "field"), FREE_FORM_PLACES,
                         ids=[place_id(p) for p in FREE_FORM_PLACES])
async def test_an_integer_out_of_the_64_bit_range_is_400_naming_the_field(api: HttpApi, method, path, role,
                                                                          template, field, value):
    reply = await send_raw(api, method, path, role, template.replace("{v}", value))
    assert_error(reply, 400, "invalid", names=f"{field}: integer out of range")


STRING_PLACES = [place for place in FREE_FORM_PLACES if place[4] != "tools[0].max_attempts"] + [
    ("POST", "/v1/sessions/s1/messages", "client", '{"text": {v}}', "text"),
    ("POST", f"{TOKEN_PATH}/fail", "worker", '{"error": {v}}', "error"),
]
SURROGATES = {"alone": LONE_SURROGATE, "inside text": '"abc\\udfffdef"', "high then high": '"\\ud800\\ud800"'}


@pytest.mark.parametrize("value", SURROGATES.values(), ids=SURROGATES.keys())
@pytest.mark.parametrize(("method", "path", "role", "template", "field"), STRING_PLACES,
                         ids=[place_id(p) for p in STRING_PLACES])
async def test_a_lone_surrogate_is_400_naming_the_field(api: HttpApi, method, path, role, template, field, value):
    reply = await send_raw(api, method, path, role, template.replace("{v}", value))
    assert_error(reply, 400, "invalid", names=f"{field}: must be valid Unicode text")


async def test_a_lone_surrogate_in_a_key_is_400_and_the_answer_escapes_it(api: HttpApi):
    reply = await send_raw(api, "POST", "/v1/sessions", "client", '{"agent": "a", "metadata": {"\\ud800": 1}}')
    assert_error(reply, 400, "invalid", names="metadata.\\ud800: key must be valid Unicode text")
    unknown = await send_raw(api, "POST", "/v1/sessions", "client", '{"agent": "a", "\\udfff": 1}')
    assert_error(unknown, 400, "invalid", names="\\udfff: unknown field")


async def test_the_64_bit_range_itself_is_stored_and_read_back(api: HttpApi):
    metadata = {"max": 2**63 - 1, "min": -(2**63), "float": 1e300}
    created = expect(await api.post("/v1/sessions", {"agent": "a", "session_id": "s-edge", "metadata": metadata}), 201)
    assert created["metadata"] == metadata
    assert (await api.snapshot("s-edge"))["metadata"] == metadata


# ---------------------------------------------------------------- one bad poll, everyone else dispatched


BAD_POLL = '{"worker_id": "evil", "agents": ["\\ud800"], "wait_ms": 20000}'


@pytest.mark.parametrize("agents", [["\ud800"], [""], ["line\nbreak"], ["x" * 201]], ids=repr)
async def test_a_poll_for_an_agent_name_that_is_not_an_id_is_400(api: HttpApi, agents):
    started = time.monotonic()
    reply = await api.post("/v1/worker/poll", {"worker_id": "w", "agents": ["ok", *agents], "wait_ms": 20_000},
                           role="worker")
    assert_error(reply, 400, "invalid", names="agents[1]")
    assert time.monotonic() - started < DEADLINE_S


