"""Request validation against the route table (api_spec.py).

Each function takes what aiohttp hands a handler (the decoded JSON body, the query, the
path's match info, the headers) and returns a plain dict with every declared field present:
validated values, or the field's default when it was left out. Anything wrong raises
`InvalidRequest` naming the field, with a message a person can act on, e.g.
``text: must be a string (got integer)``.

Bodies are checked as a whole for what JSON allows but the rest of the server cannot carry,
so that every body that validates can be written to the Raft log (msgpack) and the state
(SQLite) and read back by any client:

- non-finite numbers (Python's json module accepts NaN and Infinity);
- integers outside the signed 64-bit range (msgpack and SQLite cannot hold them; the
  decoder does not even convert integers of more than 20 characters, so Python's limit on
  int-string conversion never applies);
- strings, object keys included, that are not valid Unicode text (JSON's `\ud800` escapes
  can spell a lone surrogate, which no UTF-8 encoder takes);
- nesting deeper than MAX_JSON_DEPTH (the msgpack encoder has a recursion limit);
- a key given twice in one object (JSON leaves its meaning open; Python's decoder keeps the
  last, another reader of the same bytes may keep the first).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from json.decoder import JSONArray, JSONObject  # type: ignore[attr-defined]
from json.scanner import py_make_scanner  # type: ignore[attr-defined]
from typing import Any
from urllib.parse import urlsplit

from dex_ha.server.api_spec import PATTERN_RULES, FieldSpec, RouteSpec
from dex_ha.server.errors import HttpError

MAX_JSON_DEPTH = 100
# The integers a body may hold: the signed 64-bit range, which msgpack, SQLite and the
# usual JSON readers of other languages (int64, long) all carry exactly.
MIN_INTEGER = -(2**63)
MAX_INTEGER = 2**63 - 1
# "-9223372036854775808" has 20 characters: any integer written longer is out of range.
_MAX_INTEGER_CHARS = 20
_SURROGATE = re.compile("[\ud800-\udfff]")


class InvalidRequest(HttpError):
    """A request the API answers with 400 `invalid`: "<field>: <message>"; `field` names
    what is wrong, `message` says what is wrong with it."""

    def __init__(self, field: str, message: str) -> None:
        # Both can echo the request (an unknown key, a bad value): escape what UTF-8 cannot
        # carry, or the error answer itself could not be sent.
        field, message = _utf8_safe(field), _utf8_safe(message)
        super().__init__(400, "invalid", f"{field}: {message}")
        self.field = field
        self.message = message


class BodyTooLarge(HttpError):
    """A body over the route's `max_body_bytes`: 413 `too_large`."""

    def __init__(self, limit: int, size: int | None = None) -> None:
        got = "" if size is None else f" (got {size} bytes)"
        super().__init__(413, "too_large", f"body: must be at most {limit} bytes{got}")
        self.limit = limit
        self.message = str(self)


class FieldTooLarge(HttpError):
    """A field over the size its setting caps it at (FieldSpec.max_bytes): 413 `too_large`
    naming the field, the cap and the setting."""

    def __init__(self, field: str, setting: str, limit: int, size: int, unit: str) -> None:
        super().__init__(
            413,
            "too_large",
            f"{field}: must be at most {limit} bytes of {unit} (got {size}); the node's {setting} setting sets the cap",
        )
        self.field = field


# ---------------------------------------------------------------- public API


def decode_json_body(route: RouteSpec, raw: bytes) -> Any:
    """The JSON value in `raw` (None for an empty body), for `validate_body`.

    Raises BodyTooLarge over the route's limit, InvalidRequest for bytes that are not
    UTF-8 JSON or that spell NaN/Infinity.
    """
    if len(raw) > route.max_body_bytes:
        raise BodyTooLarge(route.max_body_bytes, len(raw))
    if not raw.strip():
        return None
    try:
        return _decoder_for(raw).decode(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise InvalidRequest("body", "must be UTF-8 encoded JSON") from None
    except json.JSONDecodeError as exc:
        raise InvalidRequest("body", f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise InvalidRequest("body", f"is nested too deeply (at most {MAX_JSON_DEPTH} levels)") from None


def validate_body(route: RouteSpec, body: Any) -> dict[str, Any]:
    """The body's fields, validated, with defaults filled in for the ones left out.

    `body` None means the request had no body: fine for a route without a body and for a
    route whose body fields are all optional.
    """
    fields = route.body or ()
    if body is None:
        if route.body_required:
            raise InvalidRequest("body", "must be a JSON object (got nothing)")
        body = {}
    if not isinstance(body, dict):
        raise InvalidRequest("body", f"must be a JSON object (got {_json_type(body)})")
    _reject_unknown(body, fields, kind="field")
    _check_json_values(body)
    return {spec.name: _field_value(spec, body, spec.name) for spec in fields}


def check_field_sizes(route: RouteSpec, args: Mapping[str, Any], caps: Mapping[str, int]) -> None:
    """Raise FieldTooLarge for a validated body field over its cap: `caps` maps each setting
    that FieldSpec.max_bytes names to its value. A string field is measured in UTF-8, any
    other field as compact JSON (as the state stores it); null and absent fields are not."""
    for spec in route.body or ():
        value = args.get(spec.name)
        if spec.max_bytes is None or value is None:
            continue
        unit = "UTF-8" if spec.type == "string" else "JSON"
        size = len((value if spec.type == "string" else _compact_json(value)).encode())
        if size > caps[spec.max_bytes]:
            raise FieldTooLarge(spec.name, spec.max_bytes, caps[spec.max_bytes], size, unit)


def _compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def validate_query(route: RouteSpec, query: Mapping[str, str]) -> dict[str, Any]:
    """The query parameters, converted to their declared types, with defaults filled in."""
    _reject_unknown(query, route.query, kind="query parameter")
    _reject_repeated(query, route.query)
    converted = {spec.name: _from_text(spec, query[spec.name]) for spec in route.query if spec.name in query}
    return {spec.name: _field_value(spec, converted, spec.name) for spec in route.query}


def validate_path(route: RouteSpec, params: Mapping[str, str]) -> dict[str, str]:
    """The path parameters (ids), checked: non-empty, at most 200 printable characters."""
    return {spec.name: _field_value(spec, params, spec.name) for spec in route.path_params}


def validate_headers(route: RouteSpec, headers: Mapping[str, str]) -> dict[str, Any]:
    """The request headers the route declares (looked up case-insensitively); others are ignored."""
    by_lower_name = {name.lower(): value for name, value in headers.items()}
    present = {
        spec.name: by_lower_name[spec.name.lower()] for spec in route.headers if spec.name.lower() in by_lower_name
    }
    return {spec.name: _field_value(spec, present, spec.name) for spec in route.headers}


# ---------------------------------------------------------------- decoding

# The most items a body may hold: each array and object counts one, and one for each of its
# elements or members, at any depth. The work of a body grows with its items, not its bytes:
# 4 MiB of `[],` are 1.4 million lists, which take the C decoder a quarter of a second with
# the interpreter lock held, and the garbage collector as long again; the Raft thread could
# not run meanwhile.
MAX_JSON_ITEMS = 100_000


class TooManyItems(HttpError):
    """A body with more than MAX_JSON_ITEMS items: 413 `too_large`."""

    def __init__(self) -> None:
        super().__init__(
            413,
            "too_large",
            f"body: must hold at most {MAX_JSON_ITEMS} JSON items (each array and object, and each of their "
            "elements and members); send fewer",
        )


def _decoder_for(raw: bytes) -> json.JSONDecoder:
    """The C decoder for a body that cannot hold more than MAX_JSON_ITEMS items: one with at
    most half as many commas and opening brackets (each container counts one more than it
    has commas; those in strings count too, so this overcounts). Else the decoder's
    Python-level scanner, which lets other threads in every few milliseconds and stops
    (TooManyItems) once it has built more than MAX_JSON_ITEMS items."""
    hooks = {
        "parse_constant": _reject_constant,
        "parse_int": _parse_int,
        "object_pairs_hook": _object_without_repeated_keys,
    }
    if raw.count(b",") + raw.count(b"[") + raw.count(b"{") <= MAX_JSON_ITEMS // 2:
        return json.JSONDecoder(**hooks)  # type: ignore[arg-type]
    return _CountingDecoder(**hooks)


class _CountingDecoder(json.JSONDecoder):
    def __init__(self, **hooks: Any) -> None:
        super().__init__(**hooks)
        self._items = 0
        self.parse_array = self._counted_array
        self.parse_object = self._counted_object
        self.scan_once = py_make_scanner(self)

    def _counted_array(self, *args: Any) -> tuple[Any, int]:
        value, end = JSONArray(*args)
        self._count(len(value) + 1)
        return value, end

    def _counted_object(self, *args: Any) -> tuple[Any, int]:
        value, end = JSONObject(*args)
        self._count(len(value) + 1)
        return value, end

    def _count(self, items: int) -> None:
        self._items += items
        if self._items > MAX_JSON_ITEMS:
            raise TooManyItems()


# ---------------------------------------------------------------- whole-request checks


def _reject_constant(name: str) -> Any:
    raise InvalidRequest("body", f"numbers must be finite (got {name})")


def _object_without_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise InvalidRequest(key, "is given twice in one JSON object; send each key once")
        found[key] = value
    return found


class _LongInteger(str):
    """An integer written with more characters than any 64-bit one: kept as its text, so
    that `_check_json_values` can name its field (converting it could exceed Python's
    limit on int-string conversion)."""


def _parse_int(text: str) -> int | _LongInteger:
    return _LongInteger(text) if len(text) > _MAX_INTEGER_CHARS else int(text)


def _reject_unknown(given: Mapping[str, Any], specs: tuple[FieldSpec, ...], *, kind: str) -> None:
    allowed = {spec.name for spec in specs}
    unknown = sorted(name for name in given if name not in allowed)
    if not unknown:
        return
    accepted = ", ".join(sorted(allowed)) if allowed else "none"
    others = f" (also unknown: {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
    raise InvalidRequest(unknown[0], f"unknown {kind}{others}; this route accepts: {accepted}")


def _reject_repeated(query: Mapping[str, str], specs: tuple[FieldSpec, ...]) -> None:
    # aiohttp's MultiDictProxy keeps every value of a repeated parameter; a plain
    # Mapping cannot repeat one.
    getall = getattr(query, "getall", None)
    if getall is None:
        return
    for spec in specs:
        if len(getall(spec.name, [])) > 1:
            raise InvalidRequest(spec.name, "must be given at most once")


def _check_json_values(body: dict[str, Any]) -> None:
    """Every value in the body, at any depth, is one the server can store (see the module
    docstring): finite numbers, 64-bit integers, valid Unicode text, bounded nesting.

    Walks with an explicit stack, so a deeply nested body cannot exhaust Python's stack.
    """
    stack: list[tuple[Any, str, int]] = [(value, name, 1) for name, value in body.items()]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise InvalidRequest(path, f"is nested too deeply (at most {MAX_JSON_DEPTH} levels)")
        _check_scalar(value, path)
        if isinstance(value, dict):
            for key in value:  # the body's own keys are known field names already
                _check_unicode(key, f"{path}.{key}", "key ")
            stack.extend((child, f"{path}.{key}", depth + 1) for key, child in value.items())
        elif isinstance(value, list):
            stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(value))


def _check_scalar(value: Any, path: str) -> None:
    if isinstance(value, _LongInteger) or (
        isinstance(value, int) and not isinstance(value, bool) and not MIN_INTEGER <= value <= MAX_INTEGER
    ):
        raise InvalidRequest(
            path, f"integer out of range: must be from {MIN_INTEGER} to {MAX_INTEGER} (got {_shortened(str(value))})"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidRequest(path, f"numbers must be finite (got {value})")
    if isinstance(value, str):
        _check_unicode(value, path, "")


def _check_unicode(text: str, path: str, what: str) -> None:
    """Lone surrogates (JSON's "\\ud800" without its pair) cannot be encoded as UTF-8."""
    if text.isascii():
        return
    found = _SURROGATE.search(text)
    if found is not None:
        raise InvalidRequest(
            path,
            f"{what}must be valid Unicode text: a lone surrogate "
            f"{found.group()!r} at character {found.start()} cannot be encoded as UTF-8",
        )


# ---------------------------------------------------------------- one field


def _field_value(spec: FieldSpec, given: Mapping[str, Any], where: str) -> Any:
    """The value of `spec` in `given`: checked when present, the default when absent."""
    if spec.name not in given:
        if spec.required:
            raise InvalidRequest(where, "is required")
        return spec.default
    value = given[spec.name]
    if value is None and (spec.nullable or spec.type == "any"):
        return None
    _check_value(spec, value, where)
    return value


def _check_value(spec: FieldSpec, value: Any, where: str) -> None:
    _check_type(spec.type, value, where, nullable=spec.nullable)
    if spec.type == "string":
        _check_string(spec, value, where)
    elif spec.type == "integer":
        _check_bounds(spec, value, where)
    elif spec.type == "array":
        _check_array(spec, value, where)


def _check_type(expected: str, value: Any, where: str, *, nullable: bool = False) -> None:
    if _has_type(expected, value):
        return
    or_null = " or null" if nullable else ""
    raise InvalidRequest(where, f"must be {_TYPE_PHRASE[expected]}{or_null} (got {_json_type(value)})")


def _has_type(expected: str, value: Any) -> bool:
    if expected == "any":
        return True
    if expected == "integer":
        return isinstance(value, int) and not isinstance(value, bool)  # bool is an int in Python, not in JSON
    if expected == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, _PYTHON_TYPE[expected])


def _check_string(spec: FieldSpec, value: str, where: str) -> None:
    if spec.enum is not None and value not in spec.enum:
        raise InvalidRequest(where, f"must be one of: {', '.join(spec.enum)} (got {_quote(value)})")
    _check_length(spec, len(value), "characters", where)
    if spec.pattern is not None and re.fullmatch(spec.pattern, value) is None:
        rule = PATTERN_RULES.get(spec.pattern, f"must match {spec.pattern}")
        raise InvalidRequest(where, f"{rule} (got {_quote(value)})")
    if spec.format is not None:
        problem = _FORMAT_CHECKS[spec.format](value)
        if problem:
            raise InvalidRequest(where, problem)


def _check_bounds(spec: FieldSpec, value: int, where: str) -> None:
    too_low = spec.min is not None and value < spec.min
    too_high = spec.max is not None and value > spec.max
    if not (too_low or too_high):
        return
    if spec.min is not None and spec.max is not None:
        raise InvalidRequest(where, f"must be between {spec.min} and {spec.max} (got {value})")
    if too_low:
        raise InvalidRequest(where, f"must be at least {spec.min} (got {value})")
    raise InvalidRequest(where, f"must be at most {spec.max} (got {value})")


def _check_array(spec: FieldSpec, value: list[Any], where: str) -> None:
    _check_length(spec, len(value), "items", where)
    assert isinstance(spec.items, FieldSpec)  # FieldSpec insists on it for arrays
    for i, item in enumerate(value):
        _check_value(spec.items, item, f"{where}[{i}]")


def _check_length(spec: FieldSpec, length: int, unit: str, where: str) -> None:
    if spec.min_length is not None and length < spec.min_length:
        if spec.min_length == 1 and unit == "characters":
            raise InvalidRequest(where, "must not be empty")
        raise InvalidRequest(where, f"must have at least {_count(spec.min_length, unit)} (got {length})")
    if spec.max_length is not None and length > spec.max_length:
        raise InvalidRequest(where, f"must have at most {_count(spec.max_length, unit)} (got {length})")


def _count(n: int, unit: str) -> str:
    """'1 item', '100 items'."""
    return f"{n} {unit[:-1] if n == 1 else unit}"


# ---------------------------------------------------------------- query text


def _from_text(spec: FieldSpec, text: str) -> Any:
    """A query parameter's text as its declared type."""
    if spec.type == "integer":
        if re.fullmatch(r"-?[0-9]{1,18}", text) is None:
            raise InvalidRequest(spec.name, f"must be an integer (got {_quote(text)})")
        return int(text)
    if spec.type == "boolean":
        if text not in ("true", "false"):
            raise InvalidRequest(spec.name, f"must be true or false (got {_quote(text)})")
        return text == "true"
    return text


# ---------------------------------------------------------------- string formats


def _id_problem(value: str) -> str:
    return "" if value.isprintable() else "must contain printable characters only"


def _host_port_problem(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]  # an IPv6 literal, e.g. [::1]:7001
    elif ":" in host:
        host = ""  # an IPv6 host without brackets is ambiguous
    port_ok = port.isascii() and port.isdigit() and 1 <= int(port) <= 65535
    host_ok = bool(host) and host.isprintable() and " " not in host
    if sep and port_ok and host_ok:
        return ""
    return f"must be host:port with a port from 1 to 65535 (got {_quote(value)})"


def _uri_problem(value: str) -> str:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        return f"must be an http:// or https:// URL (got {_quote(value)})"
    return ""


_FORMAT_CHECKS = {"id": _id_problem, "host-port": _host_port_problem, "uri": _uri_problem}


# ---------------------------------------------------------------- naming JSON types


_PYTHON_TYPE: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "boolean": bool,
    "object": dict,
    "array": list,
}

_TYPE_PHRASE = {
    "string": "a string",
    "integer": "an integer",
    "number": "a finite number",
    "boolean": "a boolean",
    "object": "a JSON object",
    "array": "an array",
    "any": "any JSON value",
}


def _json_type(value: Any) -> str:
    """The JSON name of a value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, _LongInteger):
        return "integer"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _quote(text: str, limit: int = 40) -> str:
    """A value for an error message, shortened so a huge input does not make a huge error."""
    return repr(_shortened(text, limit))


def _shortened(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _utf8_safe(text: str) -> str:
    """`text` with what UTF-8 cannot encode (lone surrogates) written as escapes."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
