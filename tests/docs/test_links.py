"""Every relative link in README.md, docs/ and deploy/ resolves inside the repository: the
file exists, and a `#anchor` names a heading of that file (as GitHub spells heading anchors).
No page points readers at notes outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "deploy").rglob("*.md")])

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
# Notes that live outside the repository: a clone does not have them.
OUTSIDE = re.compile(r"DESIGN\.md|\.\./shared|/work/shared|seeds/crash-matrix\.txt")


def prose(text: str) -> str:
    """The text without code blocks and inline code, where links are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def links(text: str) -> list[str]:
    return LINK.findall(prose(text))


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        anchor = github_anchor(heading)
        n = counts.get(anchor, 0)
        counts[anchor] = n + 1
        found.add(anchor if n == 0 else f"{anchor}-{n}")  # repeated headings: -1, -2, ...
    return found


def broken_links(page: Path, text: str | None = None) -> list[str]:
    """What is wrong with the links of `page` (its text, or `text` as if it were there)."""
    problems = []
    for target in links(page.read_text() if text is None else text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if REPO not in resolved.parents and resolved != REPO:
            problems.append(f"{target}: outside the repository")
        elif not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and (resolved.is_dir() or resolved.suffix != ".md"):
            problems.append(f"{target}: an anchor into a file that is not a page")
        elif anchor and anchor not in anchors(resolved):
            problems.append(f"{target}: no heading with anchor #{anchor} in {resolved.relative_to(REPO)}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_points_outside_the_repository(page: Path) -> None:
    hits = [line.strip() for line in page.read_text().splitlines() if OUTSIDE.search(line)]
    assert hits == [], f"{page.relative_to(REPO)} points at notes a clone does not have"


def test_the_checker_catches_what_it_should() -> None:
    # The checks above must be able to fail: a missing file, a missing anchor, a link out.
    page = REPO / "docs" / "_probe.md"  # never written: its text is given
    text = (
        "[a](architecture.md#no-such-heading) [b](missing.md) [c](../../etc/passwd) "
        "[ok](architecture.md#the-cluster) `[not a link](nowhere.md)`\n"
    )
    assert [t for t in links(text)] == [
        "architecture.md#no-such-heading",
        "missing.md",
        "../../etc/passwd",
        "architecture.md#the-cluster",
    ]
    problems = broken_links(page, text)
    assert (
        len(problems) == 3
        and "no heading" in problems[0]
        and "no such file" in problems[1]
        and "outside" in problems[2]
    ), problems


def test_github_anchors() -> None:
    assert github_anchor("Scale: add or replace a node") == "scale-add-or-replace-a-node"
    assert github_anchor("`dex-ha dev`") == "dex-ha-dev"
    assert github_anchor("#### `POST /v1/sessions/{session_id}`".lstrip("# ")) == "post-v1sessionssession_id"
