"""The OpenAPI 3.1 document that the server serves at /openapi.json, built from the route table.

Because the document, the validation and the auth checks all read `api_spec.ROUTES`, the
published schema cannot drift from what the server accepts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from dex_ha.server.api_spec import ROUTES, FieldSpec, RouteSpec

OPENAPI_VERSION = "3.1.0"
SECURITY_SCHEME = "bearer"

_JSON = "application/json"
_PATH_PARAM = re.compile(r"{([^}]+)}")

# What a JSON Schema validator or generator can check of a format. An "id" is characters
# that Python's str.isprintable() accepts: letters, marks, numbers, punctuation, symbols
# and the space. No portable regular expression spells that; the pattern rules out the
# control characters (Unicode category Cc), so every valid id matches it.
FORMAT_PATTERNS = {"id": r"^[^\x00-\x1F\x7F-\x9F]*$"}


def openapi_document(routes: Iterable[RouteSpec] = ROUTES, *, title: str = "dex-ha", version: str) -> dict[str, Any]:
    """An OpenAPI 3.1 document (plain JSON-serializable dicts) describing every route."""
    if not isinstance(version, str) or not version:
        raise ValueError("version: must be a non-empty string")
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(_openapi_path(route.path), {})[route.method.lower()] = _operation(route)
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": title,
            "version": version,
            "description": "Durable execution server for AI agent sessions, run as a highly available "
            "Raft cluster. Only the active node serves /v1 routes (except /v1/cluster); "
            "the others answer 503 not_active with leader_url and Retry-After, or, for a call marked "
            "`Dex-Forward: active` (the web console's) to a session or membership route, pass it on to "
            "the active node and relay its answer.",
        },
        "paths": paths,
        "components": {
            "schemas": _error_schemas(),
            "securitySchemes": {
                SECURITY_SCHEME: {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A token of role client, worker or admin.",
                },
            },
        },
    }


# ---------------------------------------------------------------- one operation


def _operation(route: RouteSpec) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": route.name,
        "summary": route.summary,
        "description": _access_description(route),
        "tags": [_tag(route)],
        "responses": {str(status): _response(route, status, text) for status, text in route.responses.items()},
    }
    parameters = _parameters(route)
    if parameters:
        operation["parameters"] = parameters
    if route.body:
        operation["requestBody"] = _request_body(route)
    # An empty list overrides any global requirement: the operations routes take no token.
    operation["security"] = [] if route.roles is None else [{SECURITY_SCHEME: []}]
    return operation


def _access_description(route: RouteSpec) -> str:
    if route.roles is None:
        who = "No token needed: load balancers, probes and Prometheus call it."
    else:
        roles = sorted(route.roles | {"admin"})
        who = f"Roles: {', '.join(roles)} (admin may call every route)."
    where = (
        "Served only by the active node; other nodes answer 503 not_active."
        if route.active_only
        else "Served by every node."
    )
    return f"{who} {where}"


def _tag(route: RouteSpec) -> str:
    if route.roles is None:
        return "operations"
    if route.path.startswith("/v1/cluster"):
        return "cluster"
    return "worker" if route.roles == frozenset({"worker"}) else "client"


def _parameters(route: RouteSpec) -> list[dict[str, Any]]:
    located = (
        [("path", spec) for spec in route.path_params]
        + [("query", spec) for spec in route.query]
        + [("header", spec) for spec in route.headers]
    )
    return [
        {
            "name": spec.name,
            "in": location,
            "required": location == "path" or spec.required,
            "description": spec.description,
            "schema": field_schema(spec),
        }
        for location, spec in located
    ]


def _request_body(route: RouteSpec) -> dict[str, Any]:
    assert route.body is not None
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {spec.name: field_schema(spec) for spec in route.body},
        "additionalProperties": False,
    }
    required = [spec.name for spec in route.body if spec.required]
    if required:
        schema["required"] = required
    return {
        "required": route.body_required,
        "description": f"At most {route.max_body_bytes} bytes."
        + ("" if route.body_required else " Optional: an empty body means {}."),
        "content": {_JSON: {"schema": schema}},
    }


def _response(route: RouteSpec, status: int, description: str) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description}
    if status >= 400:
        name = "NotActiveError" if status == 503 and route.active_only else "Error"
        response["content"] = {_JSON: {"schema": {"$ref": f"#/components/schemas/{name}"}}}
        if status == 503:
            response["headers"] = {
                "Retry-After": {
                    "description": "Seconds to wait before retrying.",
                    "schema": {"type": "integer", "minimum": 0},
                }
            }
        if status == 401:
            response["headers"] = {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}}
        return response
    if status == 101:  # a WebSocket upgrade: the frames follow on the connection, not as a body
        return response
    if route.stream:
        response["content"] = {"text/event-stream": {"schema": {"type": "string"}}}
    elif route.content_type != _JSON:
        response["content"] = {route.content_type: {"schema": {"type": "string"}}}
    else:
        response["content"] = {_JSON: {"schema": {"type": "object"}}}
    return response


# ---------------------------------------------------------------- schemas


def field_schema(spec: FieldSpec) -> dict[str, Any]:
    """The JSON Schema (2020-12, as OpenAPI 3.1 uses it) of one field."""
    schema: dict[str, Any] = {} if spec.type == "any" else {"type": spec.type}
    if spec.nullable and spec.type != "any":
        schema["type"] = [spec.type, "null"]
    if spec.description:
        schema["description"] = spec.description
    if spec.max_bytes is not None:
        unit = "UTF-8" if spec.type == "string" else "JSON"
        schema["description"] = (
            f"{spec.description} At most the node's {spec.max_bytes} setting in bytes of {unit} "
            "(413 too_large over it)."
        ).strip()
    if spec.enum is not None:
        schema["enum"] = list(spec.enum) + ([None] if spec.nullable else [])
    if spec.min is not None:
        schema["minimum"] = spec.min
    if spec.max is not None:
        schema["maximum"] = spec.max
    schema.update(_length_keywords(spec))
    if isinstance(spec.items, FieldSpec):
        schema["items"] = field_schema(spec.items)
    if spec.pattern is not None:
        schema["pattern"] = f"^(?:{spec.pattern})$"  # JSON Schema patterns are not anchored
    elif spec.format in FORMAT_PATTERNS:
        schema["pattern"] = FORMAT_PATTERNS[spec.format]
    if spec.format is not None:
        schema["format"] = spec.format
    if spec.default is not None:
        schema["default"] = spec.default
    return schema


def _length_keywords(spec: FieldSpec) -> dict[str, int]:
    low, high = ("minItems", "maxItems") if spec.type == "array" else ("minLength", "maxLength")
    keywords = {}
    if spec.min_length is not None:
        keywords[low] = spec.min_length
    if spec.max_length is not None:
        keywords[high] = spec.max_length
    return keywords


def _error_schemas() -> dict[str, Any]:
    error = {
        "type": "object",
        "required": ["error", "message"],
        "properties": {
            "error": {
                "type": "string",
                "description": "Machine-readable code: invalid, unauthorized, "
                "forbidden, not_found, method_not_allowed, conflict, "
                "stale_attempt, step_down_failed, too_large, unsupported_media_type, "
                "misdirected_request, not_active, unavailable, not_ready, internal.",
            },
            "message": {"type": "string", "description": "What went wrong, for people; names the field."},
        },
    }
    not_active = {
        "allOf": [
            {"$ref": "#/components/schemas/Error"},
            {
                "type": "object",
                "properties": {
                    "leader_url": {
                        "type": ["string", "null"],
                        "description": "The active node's URL when this node knows it.",
                    }
                },
            },
        ],
    }
    return {"Error": error, "NotActiveError": not_active}


def _openapi_path(path: str) -> str:
    """aiohttp's `{name}` and `{name:regex}` patterns as OpenAPI's `{name}`."""
    return _PATH_PARAM.sub(lambda m: "{" + m.group(1).split(":", 1)[0] + "}", path)
