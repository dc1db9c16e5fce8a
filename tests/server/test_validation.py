"""Request validation: bodies, query parameters, path ids and headers against the route table.

The expected values below are written from the contract (the route table of
docs/api.md), not derived from api_spec, so a wrong entry in the table fails here.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from multidict import MultiDict

from dex_ha.server.api_spec import ROUTES, ROUTES_BY_NAME
from dex_ha.server.config import ServerConfig
from dex_ha.server.validation import (
    MAX_INTEGER,
    MAX_JSON_DEPTH,
    MIN_INTEGER,
    BodyTooLarge,
    InvalidRequest,
    check_field_sizes,
    decode_json_body,
    validate_body,
    validate_headers,
    validate_path,
    validate_query,
)

# route -> (the smallest valid body, what validate_body answers for it: defaults filled in)
MINIMAL = {
    "create_session": ({"agent": "support"}, {"agent": "support", "session_id": None, "metadata": None}),
    "send_message": ({"text": "hi"}, {"text": "hi", "message_id": None, "mode": "queue"}),
    "decide_approval": ({"approved": False}, {"approved": False, "reason": None}),
    "answer_question": ({"answer": {"choice": 2}}, {"answer": {"choice": 2}}),
    "cancel_turn": ({}, {"reason": None}),
    "reconcile_tool_call": ({"outcome": "failed"}, {"outcome": "failed", "result": None, "error": None}),
    "register_agent": (
        {"tools": []},
        {"tools": [], "compaction": None, "model": None, "description": None, "metadata": None},
    ),
    "worker_poll": (
        {"worker_id": "w1", "agents": ["support"]},
        {"worker_id": "w1", "agents": ["support"], "max_tasks": 1, "wait_ms": 20_000},
    ),
    "task_heartbeat": ({"worker_id": "w1"}, {"worker_id": "w1", "deltas": None}),
    "task_complete": ({"worker_id": "w1", "result": None}, {"worker_id": "w1", "result": None, "next_tasks": 0}),
    "task_fail": (
        {"worker_id": "w1", "error": "boom"},
        {"worker_id": "w1", "error": "boom", "retryable": True, "not_started": False},
    ),
    "step_down": ({}, {"to": None, "drain_timeout_ms": None}),
    "add_member": (
        {"id": "n4", "raft_addr": "127.0.0.1:7004", "url": "http://127.0.0.1:8804"},
        {"id": "n4", "raft_addr": "127.0.0.1:7004", "url": "http://127.0.0.1:8804"},
    ),
}

# route -> a body with every field set (none to its default); it must come back unchanged.
FULL: dict[str, dict[str, Any]] = {
    "create_session": {"agent": "support", "session_id": "s-1", "metadata": {"user": "ann"}},
    "send_message": {"text": "hello", "message_id": "m-1", "mode": "steer"},
    "decide_approval": {"approved": True, "reason": "looks fine"},
    "answer_question": {"answer": ["a", 1, None]},
    "cancel_turn": {"reason": "user left"},
    "reconcile_tool_call": {"outcome": "succeeded", "result": {"id": 9}, "error": "none"},
    "register_agent": {
        "tools": [{"name": "lookup", "effect": "read"}],
        "compaction": {"max_items": 50},
        "model": {"start_to_close_ms": 60_000},
        "description": "helps",
        "metadata": {"v": 2},
    },
    "worker_poll": {"worker_id": "w1", "agents": ["a", "b"], "max_tasks": 10, "wait_ms": 0},
    "task_heartbeat": {"worker_id": "w1", "deltas": [{"text": "Hel"}, {"text": "lo"}]},
    "task_complete": {"worker_id": "w1", "result": {"status": "ok", "output": 3.5}, "next_tasks": 2},
    "task_fail": {"worker_id": "w1", "error": "429 from the model API", "retryable": False, "not_started": False},
    "step_down": {"to": "n2", "drain_timeout_ms": 5000},
    "add_member": {"id": "n4", "raft_addr": "[::1]:7004", "url": "https://n4.example:8443/"},
}

REQUIRED = {  # from the brief's route table
    "create_session": {"agent"},
    "send_message": {"text"},
    "decide_approval": {"approved"},
    "answer_question": {"answer"},
    "cancel_turn": set(),
    "reconcile_tool_call": {"outcome"},
    "register_agent": {"tools"},
    "worker_poll": {"worker_id", "agents"},
    "task_heartbeat": {"worker_id"},
    "task_complete": {"worker_id", "result"},
    "task_fail": {"worker_id", "error"},
    "step_down": set(),
    "add_member": {"id", "raft_addr", "url"},
}

BODY_ROUTES = sorted(MINIMAL)
NO_BODY_ROUTES = sorted(r.name for r in ROUTES if r.body is None)

# A value of the wrong JSON type for each declared type, and what the error must say.
WRONG_VALUE = {"string": 7, "integer": "7", "number": "7", "boolean": "yes", "object": ["x"], "array": {"x": 1}}
EXPECTED_PHRASE = {
    "string": "must be a string",
    "integer": "must be an integer",
    "number": "must be a finite number",
    "boolean": "must be a boolean",
    "object": "must be a JSON object",
    "array": "must be an array",
}
GOT = {
    "string": "(got integer)",
    "integer": "(got string)",
    "number": "(got string)",
    "boolean": "(got string)",
    "object": "(got array)",
    "array": "(got object)",
}


def invalid(route_name: str, body: object) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        validate_body(ROUTES_BY_NAME[route_name], body)
    assert caught.value.status == 400 and caught.value.code == "invalid"
    return caught.value


def with_field(route_name: str, name: str, value: object) -> dict:
    return {**FULL[route_name], name: value}


def typed_fields() -> list[tuple[str, str, str]]:
    return [(r.name, f.name, f.type) for r in ROUTES if r.body for f in r.body if f.type != "any"]


# ---------------------------------------------------------------- the tables cover every route


def test_tables_cover_every_route_with_a_body():
    assert set(MINIMAL) == set(FULL) == set(REQUIRED) == {r.name for r in ROUTES if r.body is not None}


@pytest.mark.parametrize("route_name", BODY_ROUTES)
def test_required_fields_match_the_contract(route_name):
    assert {f.name for f in ROUTES_BY_NAME[route_name].body if f.required} == REQUIRED[route_name]


# ---------------------------------------------------------------- valid bodies


@pytest.mark.parametrize("route_name", BODY_ROUTES)
def test_a_minimal_body_passes_with_defaults_filled_in(route_name):
    body, expected = MINIMAL[route_name]
    assert validate_body(ROUTES_BY_NAME[route_name], body) == expected


@pytest.mark.parametrize("route_name", BODY_ROUTES)
def test_a_full_body_comes_back_unchanged(route_name):
    assert validate_body(ROUTES_BY_NAME[route_name], FULL[route_name]) == FULL[route_name]


@pytest.mark.parametrize("route_name", ["cancel_turn", "step_down"])
def test_an_optional_body_may_be_absent(route_name):
    assert validate_body(ROUTES_BY_NAME[route_name], None) == MINIMAL[route_name][1]


@pytest.mark.parametrize("route_name", NO_BODY_ROUTES)
def test_a_route_without_a_body_accepts_nothing_or_an_empty_object(route_name):
    route = ROUTES_BY_NAME[route_name]
    assert validate_body(route, None) == {}
    assert validate_body(route, {}) == {}
    assert invalid(route_name, {"x": 1}).field == "x"


# ---------------------------------------------------------------- missing, unknown, wrong type


@pytest.mark.parametrize(("route_name", "field"), [(r, f) for r in BODY_ROUTES for f in sorted(REQUIRED[r])])
def test_each_missing_required_field_is_named(route_name, field):
    body = dict(FULL[route_name])
    del body[field]
    error = invalid(route_name, body)
    assert (error.field, error.message) == (field, "is required")
    assert str(error) == f"{field}: is required"


@pytest.mark.parametrize("route_name", sorted(n for n, req in REQUIRED.items() if req))
def test_a_route_with_required_fields_needs_a_body(route_name):
    assert invalid(route_name, None).field == "body"


@pytest.mark.parametrize("route_name", BODY_ROUTES)
def test_unknown_fields_are_named(route_name):
    error = invalid(route_name, with_field(route_name, "colour", "red"))
    assert error.field == "colour"
    assert "unknown field" in error.message
    two = invalid(route_name, {**FULL[route_name], "zeta": 1, "alpha": 2})
    assert two.field == "alpha" and "zeta" in two.message


@pytest.mark.parametrize(("route_name", "field", "type_"), typed_fields())
def test_each_field_of_the_wrong_type_is_named_with_the_expected_type(route_name, field, type_):
    error = invalid(route_name, with_field(route_name, field, WRONG_VALUE[type_]))
    assert error.field == field
    assert error.message.startswith(EXPECTED_PHRASE[type_])
    assert error.message.endswith(GOT[type_])


def test_the_message_reads_like_the_contract_example():
    assert str(invalid("send_message", {"text": 5})) == "text: must be a string (got integer)"


@pytest.mark.parametrize(
    ("route_name", "field"), [(r.name, f.name) for r in ROUTES if r.body for f in r.body if f.type == "integer"]
)
def test_a_boolean_is_not_an_integer(route_name, field):
    error = invalid(route_name, with_field(route_name, field, True))
    assert error.field == field and error.message.endswith("(got boolean)")


def test_a_float_is_not_an_integer():
    assert invalid("worker_poll", with_field("worker_poll", "max_tasks", 2.0)).message.endswith("(got number)")


@pytest.mark.parametrize("body", [[], "text", 3, True, 1.5])
def test_a_body_that_is_not_an_object_is_refused(body):
    error = invalid("send_message", body)
    assert error.field == "body" and error.message.startswith("must be a JSON object")


def test_null_is_accepted_only_where_the_field_is_nullable():
    assert validate_body(ROUTES_BY_NAME["send_message"], {"text": "x", "message_id": None})["message_id"] is None
    assert str(invalid("send_message", {"text": "x", "mode": None})) == "mode: must be a string (got null)"
    assert invalid("worker_poll", with_field("worker_poll", "max_tasks", None)).field == "max_tasks"
    assert invalid("create_session", {"agent": None}).message == "must be a string (got null)"
    # `any` means any JSON value, null included; being required only means being present.
    assert validate_body(ROUTES_BY_NAME["answer_question"], {"answer": None}) == {"answer": None}


def test_array_items_are_checked_and_named_by_index():
    error = invalid("worker_poll", with_field("worker_poll", "agents", ["a", 3]))
    assert str(error) == "agents[1]: must be a string (got integer)"
    assert invalid("register_agent", {"tools": [{"name": "x"}, "lookup"]}).field == "tools[1]"
    assert invalid("task_heartbeat", {"worker_id": "w1", "deltas": [1]}).field == "deltas[0]"


# ---------------------------------------------------------------- bounds and enums


@pytest.mark.parametrize(
    ("route_name", "field", "low", "high"),
    [
        ("worker_poll", "max_tasks", 1, 1000),
        ("worker_poll", "wait_ms", 0, 60_000),
        ("step_down", "drain_timeout_ms", 0, 3_600_000),
    ],
)
def test_integer_bounds_are_inclusive(route_name, field, low, high):
    for ok in (low, high):
        assert validate_body(ROUTES_BY_NAME[route_name], with_field(route_name, field, ok))[field] == ok
    for bad in (low - 1, high + 1):
        error = invalid(route_name, with_field(route_name, field, bad))
        assert str(error) == f"{field}: must be between {low} and {high} (got {bad})"


@pytest.mark.parametrize(
    ("route_name", "field", "limit"),
    [
        ("create_session", "agent", 200),
        ("create_session", "session_id", 200),
        ("send_message", "message_id", 200),
        ("decide_approval", "reason", 4096),
        ("cancel_turn", "reason", 4096),
        ("worker_poll", "worker_id", 200),
        ("task_fail", "error", 65_536),
        ("add_member", "id", 64),
        ("task_heartbeat", "worker_id", 200),
        ("task_complete", "worker_id", 200),
        ("task_fail", "worker_id", 200),
    ],
)
def test_string_length_limits(route_name, field, limit):
    route = ROUTES_BY_NAME[route_name]
    assert validate_body(route, with_field(route_name, field, "x" * limit))[field] == "x" * limit
    error = invalid(route_name, with_field(route_name, field, "x" * (limit + 1)))
    assert error.field == field and f"at most {limit} characters" in error.message


@pytest.mark.parametrize(
    ("route_name", "field"),
    [
        ("create_session", "agent"),
        ("send_message", "text"),
        ("worker_poll", "worker_id"),
        ("add_member", "id"),
        ("task_heartbeat", "worker_id"),
        ("task_complete", "worker_id"),
        ("task_fail", "worker_id"),
    ],
)
def test_empty_strings_are_refused_where_a_name_or_text_is_needed(route_name, field):
    assert str(invalid(route_name, with_field(route_name, field, ""))) == f"{field}: must not be empty"


@pytest.mark.parametrize(
    ("route_name", "field", "low", "high", "item"),
    [
        ("worker_poll", "agents", 1, 100, "a"),
        ("register_agent", "tools", 0, 1000, {"name": "t", "effect": "read"}),
        ("task_heartbeat", "deltas", 0, 1000, {"text": "."}),
    ],
)
def test_array_length_limits(route_name, field, low, high, item):
    route = ROUTES_BY_NAME[route_name]
    for ok in (low, high):
        assert len(validate_body(route, with_field(route_name, field, [item] * ok))[field]) == ok
    error = invalid(route_name, with_field(route_name, field, [item] * (high + 1)))
    assert error.field == field and f"at most {high} items" in error.message
    if low > 0:
        assert "at least 1 item " in invalid(route_name, with_field(route_name, field, [])).message


@pytest.mark.parametrize(
    ("route_name", "field", "allowed"),
    [
        ("send_message", "mode", ("queue", "steer")),
        ("reconcile_tool_call", "outcome", ("succeeded", "failed")),
    ],
)
def test_enums(route_name, field, allowed):
    route = ROUTES_BY_NAME[route_name]
    for value in allowed:
        assert validate_body(route, with_field(route_name, field, value))[field] == value
    error = invalid(route_name, with_field(route_name, field, "QUEUE"))
    assert error.field == field and error.message == f"must be one of: {', '.join(allowed)} (got 'QUEUE')"


# ---------------------------------------------------------------- formats


@pytest.mark.parametrize("bad", ["a\nb", "tab\there", "\x00", "del\x7f"])
def test_ids_in_a_body_must_be_printable(bad):
    error = invalid("send_message", {"text": "hi", "message_id": bad})
    assert error.field == "message_id" and "printable" in error.message


NAMES = [
    ("create_session", "session_id", {"agent": "support"}),
    ("create_session", "agent", {"session_id": "s-1"}),
]


@pytest.mark.parametrize(("route_name", "field", "rest"), NAMES)
@pytest.mark.parametrize(
    "bad", [".", "..", ".hidden", "-flag", "_x", "a b", "a/b", "a\\b", "a?b", "a#b", "a%2Fb", "é", "a\nb", "x@y"]
)
def test_new_session_and_agent_ids_keep_to_the_name_characters(route_name, field, rest, bad):
    error = invalid(route_name, {**rest, field: bad})
    assert error.field == field
    assert error.message.startswith("must start with a letter or digit and hold only letters, digits"), error.message


@pytest.mark.parametrize(("route_name", "field", "rest"), NAMES)
@pytest.mark.parametrize("good", ["a", "0", "s-1", "support_bot", "tenant:ticket.42", "A" + "x" * 199])
def test_names_that_tests_and_clients_use_stay_valid(route_name, field, rest, good):
    assert validate_body(ROUTES_BY_NAME[route_name], {**rest, field: good})[field] == good


def test_an_agent_name_in_the_path_of_register_agent_keeps_to_the_name_characters():
    route = ROUTES_BY_NAME["register_agent"]
    assert validate_path(route, {"name": "helper.v2"}) == {"name": "helper.v2"}
    for bad in ("..", "a b", "-x"):
        with pytest.raises(InvalidRequest) as caught:
            validate_path(route, {"name": bad})
        assert caught.value.field == "name" and "letter or digit" in caught.value.message


def test_ids_in_other_paths_stay_any_printable_text_so_older_sessions_stay_reachable():
    route = ROUTES_BY_NAME["get_session"]
    assert validate_path(route, {"session_id": "made before: a b"}) == {"session_id": "made before: a b"}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"agent": "a", "agent": "b"}', "agent"),
        ('{"agent": "a", "metadata": {"k": 1, "k": 2}}', "k"),
        ('{"agent": "a", "metadata": {"list": [{"x": 1, "x": 1}]}}', "x"),
    ],
)
def test_a_key_given_twice_in_one_object_is_400_naming_it(raw, field):
    error = invalid_raw("create_session", raw)
    assert (error.field, error.message) == (field, "is given twice in one JSON object; send each key once")


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("127.0.0.1:7001", True),
        ("node-2.internal:1", True),
        ("[::1]:65535", True),
        ("127.0.0.1", False),
        (":7001", False),
        ("host:0", False),
        ("host:65536", False),
        ("host:port", False),
        ("::1:7001", False),
        ("host name:7001", False),
        ("host:７００１", False),
    ],
)
def test_raft_addr_must_be_host_and_port(value, ok):
    route = ROUTES_BY_NAME["add_member"]
    body = with_field("add_member", "raft_addr", value)
    if ok:
        assert validate_body(route, body)["raft_addr"] == value
    else:
        assert invalid("add_member", body).field == "raft_addr"


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("http://10.0.0.4:8801", True),
        ("https://n4.example", True),
        ("http://[::1]:8801/base", True),
        ("ftp://n4.example", False),
        ("n4.example:8801", False),
        ("http://", False),
        ("http://h:99999", False),
    ],
)
def test_member_url_must_be_http_or_https(value, ok):
    route = ROUTES_BY_NAME["add_member"]
    body = with_field("add_member", "url", value)
    if ok:
        assert validate_body(route, body)["url"] == value
    else:
        assert invalid("add_member", body).field == "url"


# ---------------------------------------------------------------- JSON values the server cannot carry


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_numbers_must_be_finite_at_any_depth(number):
    error = invalid("answer_question", {"answer": {"scores": [1.0, number]}})
    assert error.field == "answer.scores[1]" and "finite" in error.message
    assert invalid("task_complete", {"result": number}).field == "result"


def test_nesting_is_limited():
    def nested(depth: int) -> object:
        value: object = "leaf"
        for _ in range(depth):
            value = [value]
        return value

    route = ROUTES_BY_NAME["task_complete"]
    deep_enough = {"worker_id": "w1", "result": nested(MAX_JSON_DEPTH - 1)}
    assert validate_body(route, deep_enough)["result"] == nested(MAX_JSON_DEPTH - 1)
    error = invalid("task_complete", {"worker_id": "w1", "result": nested(MAX_JSON_DEPTH + 5)})
    assert error.field.startswith("result[0]") and "nested too deeply" in error.message


# ---------------------------------------------------------------- values msgpack and SQLite cannot carry


def body_of(route_name: str, raw: str) -> dict:
    route = ROUTES_BY_NAME[route_name]
    return validate_body(route, decode_json_body(route, raw.encode()))


def invalid_raw(route_name: str, raw: str) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        body_of(route_name, raw)
    return caught.value


def test_integers_at_the_ends_of_the_64_bit_range_pass():
    assert (MIN_INTEGER, MAX_INTEGER) == (-(2**63), 2**63 - 1)
    metadata = body_of(
        "create_session",
        '{"agent": "a", "metadata": {"max": 9223372036854775807, '
        '"min": -9223372036854775808, "zero": 0, "flag": true}}',
    )["metadata"]
    assert metadata == {"max": MAX_INTEGER, "min": MIN_INTEGER, "zero": 0, "flag": True}


@pytest.mark.parametrize(
    "text",
    [
        "9223372036854775808",
        "-9223372036854775809",
        "18446744073709551616",
        "123456789012345678901",
        "-" + "9" * 30,
        "9" * 5000,
    ],
)
def test_integers_outside_the_64_bit_range_are_named_at_any_depth(text):
    error = invalid_raw("task_complete", '{"result": {"rows": [1, {"n": ' + text + "}]}}")
    assert error.field == "result.rows[1].n"
    assert error.message.startswith("integer out of range: must be from -9223372036854775808 to 9223372036854775807")
    assert len(str(error)) < 200  # a 5000-digit value is not echoed whole


def test_an_integer_field_out_of_range_is_named_before_its_bounds_are_checked():
    assert (
        invalid_raw("worker_poll", '{"worker_id": "w", "agents": ["a"], "max_tasks": %s}' % ("1" * 5000)).field
        == "max_tasks"
    )


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"text": "\\ud800"}', "text"),
        ('{"text": "ok \\udc00 then more"}', "text"),
        ('{"text": "hi", "message_id": "\\udbff"}', "message_id"),
    ],
)
def test_a_lone_surrogate_in_a_string_is_named(raw, field):
    error = invalid_raw("send_message", raw)
    assert error.field == field and "must be valid Unicode text" in error.message
    str(error).encode("utf-8")  # the error itself can be sent


def test_a_lone_surrogate_in_a_key_or_an_array_is_named_and_escaped():
    key = invalid_raw("create_session", '{"agent": "a", "metadata": {"ok": {"\\ud800x": 1}}}')
    assert key.field == "metadata.ok.\\ud800x" and key.message.startswith("key must be valid Unicode text")
    item = invalid_raw("answer_question", '{"answer": ["fine", "\\udfff"]}')
    assert item.field == "answer[1]"
    unknown = invalid_raw("create_session", '{"agent": "a", "\\ud800": 1}')
    assert unknown.field == "\\ud800" and "unknown field" in unknown.message
    for error in (key, item, unknown):
        str(error).encode("utf-8")


def test_a_surrogate_pair_is_just_a_character():
    assert body_of("send_message", '{"text": "\\ud83d\\ude00"}')["text"] == "\U0001f600"


@pytest.mark.parametrize(
    ("agent", "problem"),
    [
        ("", "must not be empty"),
        ("a\tb", "printable"),
        ("x" * 201, "at most 200 characters"),
        ("\ud800", "valid Unicode text"),
    ],
)
def test_poll_agents_are_ids(agent, problem):
    error = invalid("worker_poll", {"worker_id": "w", "agents": ["fine", agent]})
    assert error.field == "agents[1]" and problem in error.message


# ---------------------------------------------------------------- decoding the raw body


def test_decode_json_body():
    route = ROUTES_BY_NAME["send_message"]
    assert decode_json_body(route, b"") is None
    assert decode_json_body(route, b" \n") is None
    assert decode_json_body(route, '{"text": "héllo"}'.encode()) == {"text": "héllo"}
    for raw, hint in [
        (b"{", "not valid JSON"),
        (b"\xff\xfe", "UTF-8"),
        (b'{"a": NaN}', "finite"),
        (b"[" * 100_000, ""),
    ]:
        with pytest.raises(InvalidRequest) as caught:
            decode_json_body(route, raw)
        assert caught.value.field == "body" and hint in caught.value.message


@pytest.mark.parametrize(
    ("route_name", "limit"),
    [
        ("task_heartbeat", 256 * 1024),
        ("task_complete", 4 * 1024 * 1024),
        ("create_session", 1024 * 1024),
    ],
)
def test_a_body_over_the_route_limit_is_too_large(route_name, limit):
    route = ROUTES_BY_NAME[route_name]
    assert route.max_body_bytes == limit
    padding = limit - len(json.dumps({"x": ""}))
    at_limit = json.dumps({"x": "y" * padding}).encode()
    assert len(at_limit) == limit and decode_json_body(route, at_limit) == {"x": "y" * padding}
    with pytest.raises(BodyTooLarge) as caught:
        decode_json_body(route, at_limit + b" ")
    assert caught.value.status == 413 and caught.value.code == "too_large"
    assert str(limit) in caught.value.message


def test_any_text_within_the_default_message_cap_fits_in_a_message_body():
    # The worst case for JSON: every character escaped as a surrogate pair (12 bytes for 4 of UTF-8).
    route = ROUTES_BY_NAME["send_message"]
    text = "\U0001f600" * (ServerConfig.max_message_bytes // 4)
    raw = json.dumps({"text": text}).encode()
    args = validate_body(route, decode_json_body(route, raw))
    check_field_sizes(route, args, {"max_message_bytes": ServerConfig.max_message_bytes})
    assert args["text"] == text


# ---------------------------------------------------------------- query parameters


def test_list_sessions_query_defaults_and_conversion():
    route = ROUTES_BY_NAME["list_sessions"]
    assert validate_query(route, {}) == {
        "agent": None,
        "status": None,
        "limit": 100,
        "after": None,
        "awaiting_approval": None,
        "outcome_unknown": None,
        "order": "newest",
        "id_contains": None,
        "metadata": None,
    }
    assert validate_query(route, {"agent": "support", "status": "running", "limit": "50", "after": "s-9"}) == {
        "agent": "support",
        "status": "running",
        "limit": 50,
        "after": "s-9",
        "awaiting_approval": None,
        "outcome_unknown": None,
        "order": "newest",
        "id_contains": None,
        "metadata": None,
    }


@pytest.mark.parametrize(
    ("query", "field", "message"),
    [
        ({"limit": "0"}, "limit", "must be between 1 and 1000 (got 0)"),
        ({"limit": "1001"}, "limit", "must be between 1 and 1000 (got 1001)"),
        ({"limit": "ten"}, "limit", "must be an integer (got 'ten')"),
        ({"limit": "1.5"}, "limit", "must be an integer (got '1.5')"),
        ({"limit": ""}, "limit", "must be an integer (got '')"),
        ({"status": "done"}, "status", "must be one of: idle, running (got 'done')"),
        ({"agent": "a" * 201}, "agent", "must have at most 200 characters (got 201)"),
        (
            {"page": "2"},
            "page",
            "unknown query parameter; this route accepts: after, agent, "
            "awaiting_approval, id_contains, limit, metadata, order, outcome_unknown, status",
        ),
        ({"order": "oldest"}, "order", "must be one of: newest, id (got 'oldest')"),
        (
            {"metadata": "customer"},
            "metadata",
            "must be key=value (a top-level key of the metadata, then its value) (got 'customer')",
        ),
        ({"id_contains": ""}, "id_contains", "must not be empty"),
    ],
)
def test_bad_list_sessions_queries(query, field, message):
    with pytest.raises(InvalidRequest) as caught:
        validate_query(ROUTES_BY_NAME["list_sessions"], query)
    assert (caught.value.field, caught.value.message) == (field, message)


def test_a_repeated_query_parameter_is_refused():
    with pytest.raises(InvalidRequest) as caught:
        validate_query(ROUTES_BY_NAME["list_sessions"], MultiDict([("limit", "5"), ("limit", "6")]))
    assert caught.value.field == "limit"
    assert validate_query(ROUTES_BY_NAME["list_sessions"], MultiDict([("limit", "5")]))["limit"] == 5


def test_event_stream_resumes_after_a_decimal_event_id():
    route = ROUTES_BY_NAME["session_events"]
    assert validate_query(route, {}) == {"after": None}
    assert validate_query(route, {"after": "12345"}) == {"after": "12345"}
    for bad in ("12a", "-1", "", "1 2"):
        with pytest.raises(InvalidRequest) as caught:
            validate_query(route, {"after": bad})
        assert caught.value.field == "after"


@pytest.mark.parametrize("route_name", sorted(r.name for r in ROUTES if not r.query))
def test_routes_without_query_parameters_refuse_any(route_name):
    route = ROUTES_BY_NAME[route_name]
    assert validate_query(route, {}) == {}
    with pytest.raises(InvalidRequest) as caught:
        validate_query(route, {"debug": "1"})
    assert caught.value.field == "debug"


# ---------------------------------------------------------------- headers


def test_last_event_id_header_is_read_case_insensitively_and_checked():
    route = ROUTES_BY_NAME["session_events"]
    none = {"Dex-Namespace": None}
    assert validate_headers(route, {"Accept": "text/event-stream"}) == {**none, "Last-Event-ID": None}
    assert validate_headers(route, {"last-event-id": "42", "X-Other": "?"}) == {**none, "Last-Event-ID": "42"}
    with pytest.raises(InvalidRequest) as caught:
        validate_headers(route, {"Last-Event-ID": "latest"})
    assert caught.value.field == "Last-Event-ID"
    assert validate_headers(ROUTES_BY_NAME["get_session"], {"Last-Event-ID": "latest"}) == none


@pytest.mark.parametrize("value", ["", ".", "..", "a/b", "-a", "a b", "x" * 201])
def test_a_namespace_outside_the_id_character_set_is_refused_naming_the_header(value):
    with pytest.raises(InvalidRequest) as caught:
        validate_headers(ROUTES_BY_NAME["list_sessions"], {"dex-namespace": value})
    assert caught.value.field == "Dex-Namespace"
    assert validate_headers(ROUTES_BY_NAME["list_sessions"], {"dex-namespace": "team-a.1"}) == {
        "Dex-Namespace": "team-a.1"
    }


# ---------------------------------------------------------------- path ids


@pytest.mark.parametrize("route_name", sorted(r.name for r in ROUTES if r.path_params))
def test_path_ids(route_name):
    route = ROUTES_BY_NAME[route_name]
    names = [spec.name for spec in route.path_params]
    good = {name: f"{name}-1" for name in names}
    assert validate_path(route, good) == good
    longest = {name: "x" * spec.max_length for name, spec in zip(names, route.path_params)}
    assert validate_path(route, longest) == longest
    for bad in ("", "x" * (route.path_params[-1].max_length + 1), "a\x00b", "line\nbreak"):
        with pytest.raises(InvalidRequest) as caught:
            validate_path(route, {**good, names[-1]: bad})
        assert caught.value.field == names[-1]


def test_path_ids_allow_200_characters_except_member_ids():
    limits = {spec.name: spec.max_length for route in ROUTES for spec in route.path_params}
    assert limits == {
        "session_id": 200,
        "call_id": 200,
        "question_id": 200,
        "task_token": 200,
        "name": 200,
        "member_id": 64,
    }
