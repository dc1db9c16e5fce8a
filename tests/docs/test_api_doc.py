"""docs/api.md against the API a node really serves: every route of /openapi.json is on the
page, the page names no route that does not exist, and its generated part is current
(scripts/api_doc.py writes it)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiohttp

from scripts import api_doc
from tests.server.node_fixture import base_url, single_node_config, start_node

# "`POST /v1/sessions`", "GET /readyz": a method, a space and an absolute path.
ROUTE_MENTION = re.compile(r"\b(GET|POST|PUT|PATCH|DELETE) (/[^\s`)|,;:]*)")


def routes_of(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, methods in document["paths"].items() for method in methods}


def routes_named(page: str) -> set[tuple[str, str]]:
    return {(method, path.rstrip(".")) for method, path in ROUTE_MENTION.findall(page)}


async def served_openapi(tmp_path: Path) -> dict[str, Any]:
    """GET /openapi.json of a real node (dex-ha dev on a free port)."""
    node = await start_node(single_node_config(tmp_path / "node"))
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(base_url(node) + "/openapi.json", timeout=aiohttp.ClientTimeout(total=10)) as reply:
                assert reply.status == 200, await reply.text()
                return await reply.json()
    finally:
        await node.stop()


async def test_the_page_names_exactly_the_served_routes(tmp_path: Path) -> None:
    served = routes_of(await served_openapi(tmp_path))
    named = routes_named(api_doc.DOC.read_text())
    assert served, "the node served an OpenAPI document without routes"
    missing, unknown = sorted(served - named), sorted(named - served)
    assert not missing, f"docs/api.md does not name these routes (run python scripts/api_doc.py): {missing}"
    assert not unknown, f"docs/api.md names routes the node does not serve: {unknown}"


async def test_the_generated_part_is_current(tmp_path: Path) -> None:
    page = api_doc.DOC.read_text()
    fresh = api_doc.render(page, await served_openapi(tmp_path))
    assert fresh == page, "docs/api.md is stale: run python scripts/api_doc.py"


def test_a_route_missing_from_the_page_is_caught() -> None:
    # The check above must be able to fail: drop one route's section and it is missing.
    page = api_doc.DOC.read_text()
    without = re.sub(r"#### `DELETE /v1/cluster/members/\{member_id\}`.*?(?=\n#### |\n<!-- end)", "", page, flags=re.S)
    assert without != page, "the page has no section for DELETE /v1/cluster/members/{member_id}"
    assert ("DELETE", "/v1/cluster/members/{member_id}") not in routes_named(without)


def test_a_route_that_does_not_exist_is_caught() -> None:
    named = routes_named("Call `POST /v1/sessions/{session_id}/rewind` to go back.")
    assert named == {("POST", "/v1/sessions/{session_id}/rewind")}


def test_every_tag_has_a_section() -> None:
    document = {"paths": {"/x": {"get": {"tags": ["mystery"], "summary": "s", "description": "d", "responses": {}}}}}
    try:
        api_doc.routes_markdown(document)
    except ValueError as exc:
        assert "mystery" in str(exc)
    else:
        raise AssertionError("a route with a tag that has no section was silently dropped")
