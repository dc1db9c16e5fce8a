"""The route table matches the contract, and /openapi.json describes every route of it.

When jsonschema and openapi-spec-validator happen to be installed, the document is also
checked by them, and the request schemas in it are shown to agree with validate_body.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest

from dex_ha.server.api_spec import ROUTES, ROUTES_BY_NAME, FieldSpec, RouteSpec
from dex_ha.server.openapi import FORMAT_PATTERNS, openapi_document
from dex_ha.server.validation import InvalidRequest, validate_body

C, W, A = frozenset({"client"}), frozenset({"worker"}), frozenset({"admin"})
ANY = frozenset({"client", "worker", "admin"})

# The contract (docs/api.md): name, method, path, roles, active_only, stream.
CONTRACT = [
    ("livez", "GET", "/livez", None, False, False),
    ("readyz", "GET", "/readyz", None, False, False),
    ("metrics", "GET", "/metrics", None, False, False),
    ("openapi", "GET", "/openapi.json", None, False, False),
    ("create_session", "POST", "/v1/sessions", C, True, False),
    ("list_sessions", "GET", "/v1/sessions", C, True, False),
    ("get_session", "GET", "/v1/sessions/{session_id}", C, True, False),
    ("delete_session", "DELETE", "/v1/sessions/{session_id}", C, True, False),
    ("send_message", "POST", "/v1/sessions/{session_id}/messages", C, True, False),
    ("decide_approval", "POST", "/v1/sessions/{session_id}/approvals/{call_id}", C, True, False),
    ("answer_question", "POST", "/v1/sessions/{session_id}/questions/{question_id}/answer", C, True, False),
    ("cancel_turn", "POST", "/v1/sessions/{session_id}/cancel", C, True, False),
    ("reconcile_tool_call", "POST", "/v1/sessions/{session_id}/tool-calls/{call_id}/reconcile", C, True, False),
    ("session_events", "GET", "/v1/sessions/{session_id}/events", C, True, True),
    ("register_agent", "PUT", "/v1/agents/{name}", W, True, False),
    ("worker_poll", "POST", "/v1/worker/poll", W, True, False),
    ("worker_channel", "GET", "/v1/worker/channel", W, True, False),
    ("task_heartbeat", "POST", "/v1/worker/tasks/{task_token}/heartbeat", W, True, False),
    ("task_complete", "POST", "/v1/worker/tasks/{task_token}/complete", W, True, False),
    ("task_fail", "POST", "/v1/worker/tasks/{task_token}/fail", W, True, False),
    ("cluster", "GET", "/v1/cluster", ANY, False, False),
    ("cluster_nodes", "GET", "/v1/cluster/nodes", ANY, False, False),
    ("step_down", "POST", "/v1/cluster/step-down", A, True, False),
    ("add_member", "POST", "/v1/cluster/members", A, True, False),
    ("promote_member", "POST", "/v1/cluster/members/{member_id}/promote", A, True, False),
    ("remove_member", "DELETE", "/v1/cluster/members/{member_id}", A, True, False),
    ("backup", "GET", "/v1/cluster/backup", A, True, False),
]


@pytest.fixture(scope="module")
def document() -> dict:
    return openapi_document(version="9.8.7")


def operation(document: dict, route: RouteSpec) -> dict:
    return document["paths"][route.path][route.method.lower()]


# ---------------------------------------------------------------- the route table


def test_the_route_table_is_the_contract():
    table = [(r.name, r.method, r.path, r.roles, r.active_only, r.stream) for r in ROUTES]
    assert table == CONTRACT
    assert list(ROUTES_BY_NAME) == [row[0] for row in CONTRACT]


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
def test_path_params_are_the_ids_in_the_path(route):
    assert [spec.name for spec in route.path_params] == re.findall(r"{(\w+)}", route.path)
    assert all(spec.required and spec.type == "string" for spec in route.path_params)


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
def test_input_names_are_unique_within_a_route(route):
    # The app merges path, query, header and body values into one dict of handler arguments.
    names = [s.name for group in (route.path_params, route.query, route.headers, route.body or ()) for s in group]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
def test_every_route_documents_the_statuses_it_can_answer(route):
    statuses = set(route.responses)
    assert any(200 <= s < 300 or s == 101 for s in statuses)  # 101: the Worker channel's WebSocket
    assert (401 in statuses) == (route.roles is not None)
    assert 403 in statuses and "another site (Origin)" in route.responses[403], "a page of another site is refused"
    assert 421 in statuses, "a Host this node does not serve is refused"
    assert (415 in statuses) == (route.method in ("POST", "PUT", "DELETE")), "only JSON may change things"
    assert (413 in statuses) == (route.body is not None)
    assert (400 in statuses) == bool(route.body is not None or route.query or route.path_params or route.headers)
    assert (503 in statuses) == (route.active_only or route.bounded or route.name == "readyz")
    if route.bounded:
        assert "overloaded" in route.responses[503], "admission control may shed it"
    if route.path_params and route.roles is not None and route.method != "PUT":  # PUT creates what it names
        assert 404 in statuses, "an id in the path can name nothing"
    assert all(isinstance(text, str) and text for text in route.responses.values())


def test_success_statuses_from_the_contract():
    assert set(ROUTES_BY_NAME["create_session"].responses) >= {200, 201, 409}
    assert 202 in ROUTES_BY_NAME["send_message"].responses
    for name in (
        "decide_approval",
        "answer_question",
        "reconcile_tool_call",
        "task_heartbeat",
        "task_complete",
        "task_fail",
    ):
        assert 409 in ROUTES_BY_NAME[name].responses, name


# ---------------------------------------------------------------- the document


def test_the_document_is_openapi_3_1_and_json(document):
    assert document["openapi"] == "3.1.0"
    assert document["info"]["version"] == "9.8.7" and document["info"]["title"] == "dex-ha"
    assert json.loads(json.dumps(document)) == document
    assert openapi_document(version="1", title="other")["info"]["title"] == "other"
    with pytest.raises(ValueError):
        openapi_document(version="")


def test_every_route_appears_once_with_its_method(document):
    found = [
        (path, method.upper(), op["operationId"])
        for path, item in document["paths"].items()
        for method, op in item.items()
    ]
    assert sorted(found) == sorted((path, method, name) for name, method, path, *_ in CONTRACT)


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
def test_parameters(document, route):
    params = {(p["in"], p["name"]): p for p in operation(document, route).get("parameters", [])}
    expected = (
        {("path", s.name) for s in route.path_params}
        | {("query", s.name) for s in route.query}
        | {("header", s.name) for s in route.headers}
    )
    assert set(params) == expected
    for (location, _), param in params.items():
        assert param["schema"]["type"] in ("string", "integer", "boolean")
        if location == "path":
            assert param["required"] is True
            assert param["schema"]["minLength"] == 1 and param["schema"]["maxLength"] in (64, 200)


def test_query_and_header_parameter_schemas(document):
    params = {p["name"]: p for p in operation(document, ROUTES_BY_NAME["list_sessions"])["parameters"]}
    assert params["limit"]["schema"] == {
        "type": "integer",
        "description": "Page size: at most this many sessions. A page also ends once it holds the node's "
        "page_max_bytes; next_after says where the next one starts.",
        "minimum": 1,
        "maximum": 1000,
        "default": 100,
    }
    assert params["status"]["schema"]["enum"] == ["idle", "running"]
    assert params["limit"]["required"] is False
    events = {p["name"]: p for p in operation(document, ROUTES_BY_NAME["session_events"])["parameters"]}
    assert events["Last-Event-ID"]["in"] == "header"
    assert re.fullmatch(events["after"]["schema"]["pattern"], "123")
    assert not re.search(events["after"]["schema"]["pattern"], "12a")


@pytest.mark.parametrize("route", [r for r in ROUTES if r.body], ids=lambda r: r.name)
def test_request_body_schema(document, route):
    body = operation(document, route)["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert list(schema["properties"]) == [spec.name for spec in route.body]
    required = [spec.name for spec in route.body if spec.required]
    assert schema.get("required", []) == required
    assert body["required"] is bool(required)


def test_field_schemas_carry_types_enums_bounds_and_nullability(document):
    poll = operation(document, ROUTES_BY_NAME["worker_poll"])["requestBody"]["content"]["application/json"]["schema"]
    max_tasks = poll["properties"]["max_tasks"]
    assert {k: max_tasks[k] for k in ("type", "minimum", "maximum", "default")} == {
        "type": "integer",
        "minimum": 1,
        "maximum": 1000,
        "default": 1,
    }
    agent = poll["properties"]["agents"]["items"]  # an agent name is an id
    assert {k: agent[k] for k in ("type", "minLength", "maxLength", "format")} == {
        "type": "string",
        "minLength": 1,
        "maxLength": 200,
        "format": "id",
    }
    assert (poll["properties"]["agents"]["minItems"], poll["properties"]["agents"]["maxItems"]) == (1, 100)
    message = operation(document, ROUTES_BY_NAME["send_message"])["requestBody"]["content"]["application/json"]
    props = message["schema"]["properties"]
    assert props["mode"]["enum"] == ["queue", "steer"] and props["mode"]["default"] == "queue"
    assert "max_message_bytes setting in bytes of UTF-8" in props["text"]["description"]  # a cap in bytes
    assert props["message_id"]["type"] == ["string", "null"]
    answer = operation(document, ROUTES_BY_NAME["answer_question"])["requestBody"]["content"]["application/json"]
    assert "type" not in answer["schema"]["properties"]["answer"]  # any JSON value
    fail = operation(document, ROUTES_BY_NAME["task_fail"])["requestBody"]["content"]["application/json"]
    assert fail["schema"]["properties"]["retryable"]["default"] is True


@pytest.mark.parametrize("route", [r for r in ROUTES if not r.body], ids=lambda r: r.name)
def test_routes_without_a_body_have_no_request_body(document, route):
    assert "requestBody" not in operation(document, route)


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
def test_responses(document, route):
    responses = operation(document, route)["responses"]
    assert set(responses) == {str(status) for status in route.responses}
    for status, response in responses.items():
        assert response["description"] == route.responses[int(status)]
        if int(status) >= 400:
            ref = response["content"]["application/json"]["schema"]["$ref"]
            expected = "NotActiveError" if status == "503" and route.active_only else "Error"
            assert ref == f"#/components/schemas/{expected}"
    success = next(r for s, r in responses.items() if s.startswith("2") or s == "101")
    if route.name == "worker_channel":
        assert "content" not in success  # a WebSocket upgrade has no body
    elif route.stream:
        assert list(success["content"]) == ["text/event-stream"]
    elif route.name == "metrics":
        assert next(iter(success["content"])).startswith("text/plain")
    elif route.name == "backup":
        assert list(success["content"]) == ["application/octet-stream"]
    else:
        assert list(success["content"]) == ["application/json"]


def test_error_schemas(document):
    schemas = document["components"]["schemas"]
    assert schemas["Error"]["required"] == ["error", "message"]
    assert set(schemas["Error"]["properties"]) == {"error", "message"}
    not_active = schemas["NotActiveError"]["allOf"]
    assert {"$ref": "#/components/schemas/Error"} in not_active
    assert any("leader_url" in part.get("properties", {}) for part in not_active)
    assert "Retry-After" in operation(document, ROUTES_BY_NAME["get_session"])["responses"]["503"]["headers"]


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
def test_security_and_roles(document, route):
    op = operation(document, route)
    assert document["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "A token of role client, worker or admin.",
    }
    if route.roles is None:
        assert op["security"] == []
    else:
        assert op["security"] == [{"bearer": []}]
        for role in route.roles | {"admin"}:
            assert role in op["description"]
        for role in {"client", "worker"} - route.roles:
            assert role not in op["description"].split("(")[0]


# ---------------------------------------------------------------- checked by third-party validators


def test_a_standard_validator_accepts_the_document(document):
    validator = pytest.importorskip("openapi_spec_validator")
    validator.validate(copy.deepcopy(document))


def _sample_bodies(route: RouteSpec) -> list[object]:
    """Valid and invalid bodies built from each field's kind (no formats, no NaN: JSON Schema
    leaves formats unchecked by default and JSON cannot carry NaN)."""
    good = {"string": "ok", "integer": 5, "number": 1.5, "boolean": True, "object": {}, "array": [], "any": [1]}
    wrong = {"string": 3, "integer": "5", "number": "x", "boolean": 1, "object": [], "array": {}, "any": None}
    assert route.body is not None
    base: dict[str, Any] = {}  # a JSON body
    for spec in route.body:
        value = spec.enum[0] if spec.enum else good[spec.type]
        if spec.type == "array":
            value = [good[_item_type(spec)]] * max(1, spec.min_length or 0)
        if spec.type == "integer" and spec.min is not None:
            value = spec.min
        if spec.format is not None:
            value = {"id": "n1", "host-port": "127.0.0.1:7001", "uri": "http://127.0.0.1:8801"}[spec.format]
        base[spec.name] = value
    samples: list[object] = [base, {**base, "unknown_field": 1}, [], "s"]
    for spec in route.body:
        samples.append({k: v for k, v in base.items() if k != spec.name})
        samples.append({**base, spec.name: wrong[spec.type]})
        samples.append({**base, spec.name: None})
        if spec.type == "integer":
            samples.append({**base, spec.name: True})
            if spec.max is not None:
                samples.extend([{**base, spec.name: spec.max}, {**base, spec.name: spec.max + 1}])
        if spec.enum:
            samples.append({**base, spec.name: "not-in-enum"})
        if spec.max_length is not None:
            over = spec.max_length + 1
            too_long = "x" * over if spec.type == "string" else [base[spec.name][0]] * over
            samples.append({**base, spec.name: too_long})
        if spec.type == "array":
            samples.append({**base, spec.name: [wrong[_item_type(spec)]]})
    return samples


def _item_type(array: FieldSpec) -> str:
    assert isinstance(array.items, FieldSpec)  # FieldSpec insists on it for arrays
    return array.items.type


@pytest.mark.parametrize("route", [r for r in ROUTES if r.body], ids=lambda r: r.name)
def test_the_published_schema_and_validate_body_agree(document, route):
    jsonschema = pytest.importorskip("jsonschema")
    schema = operation(document, route)["requestBody"]["content"]["application/json"]["schema"]
    validator = jsonschema.Draft202012Validator(schema)
    verdicts = {True: 0, False: 0}
    for body in _sample_bodies(route):
        try:
            validate_body(route, body)
            accepted = True
        except InvalidRequest:
            accepted = False
        assert validator.is_valid(body) == accepted, body
        verdicts[accepted] += 1
    assert verdicts[True] >= 1 and verdicts[False] >= 3  # the samples test both sides


# ---------------------------------------------------------------- ids as a pattern


def test_every_id_in_the_document_carries_the_id_pattern(document):
    id_schemas = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("format") == "id":
                id_schemas.append(node)
            for child in node.values():
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(document)
    assert len(id_schemas) >= 10  # path ids, body ids, the poll's agent names
    assert all(s["pattern"] == FORMAT_PATTERNS["id"] for s in id_schemas)


def test_the_id_pattern_accepts_every_valid_id_and_refuses_control_characters():
    pattern = re.compile(FORMAT_PATTERNS["id"])
    assert all(pattern.match(chr(c)) for c in range(0x110000) if chr(c).isprintable())
    for bad in ("a\nb", "\x00", "tab\t", "del\x7f", "c1\x85"):
        assert not pattern.match(bad)
        with pytest.raises(InvalidRequest):
            validate_body(ROUTES_BY_NAME["create_session"], {"agent": bad})
