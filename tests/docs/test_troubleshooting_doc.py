"""docs/troubleshooting.md quotes real messages: every line of its ```log blocks is a log
line or an error message that the code can print (a string or f-string literal in dex_ha/,
with `<…>` where the code fills in a value)."""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "troubleshooting.md"
LOG_BLOCK = re.compile(r"^\s*```log\n(.*?)^\s*```", re.M | re.S)
PLACEHOLDER = re.compile(r"<[^<>]+>")
PERCENT_SPEC = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdrfgi]")
# A template with less literal text than this ("%s: %s") would match any line.
MIN_LITERAL = 12
# The dex-ha command prints an error as "dex-ha <command>: <message>" (dex_ha/cli/main.py).
CLI_PREFIX = re.compile(r"^dex-ha [a-z-]+: ")


def quoted_lines(page: str) -> list[str]:
    return [line.strip() for block in LOG_BLOCK.findall(page) for line in block.splitlines() if line.strip()]


def _regex(pieces: list[str | None]) -> tuple[re.Pattern[str], int]:
    """A regex for literal pieces and values (None), and how much literal text it has."""
    literal = sum(len(p) for p in pieces if p)
    pattern = "".join(".+" if p is None else re.escape(p) for p in pieces)
    return re.compile(pattern, re.S), literal


def _percent_pieces(text: str) -> list[str | None]:
    pieces: list[str | None] = []
    for i, part in enumerate(PERCENT_SPEC.split(text.replace("%%", "%"))):
        if i:
            pieces.append(None)
        pieces.append(part)
    return pieces


@lru_cache(maxsize=1)
def templates() -> tuple[re.Pattern[str], ...]:
    """Every string and f-string literal of dex_ha/ as a regex (values: `.+`)."""
    found = []
    for path in (REPO / "dex_ha").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr):
                pieces = [
                    v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else None for v in node.values
                ]
                found.append(_regex([p for p in pieces if p != ""]))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.append(_regex(_percent_pieces(node.value)))
    return tuple(pattern for pattern, literal in found if literal >= MIN_LITERAL)


def as_printed(line: str) -> list[str]:
    """The line as the code would print it, values filled in; also without a known prefix."""
    candidates = []
    for text in (PLACEHOLDER.sub("X", line), line):  # the raw line too: a message may say "<token>"
        if text.startswith("… "):  # the end of a longer line: the code put a value (and ": ") first
            text = text[2:]
            candidates += [f"X {text}", f"X: {text}"]
        candidates.append(text)
        if CLI_PREFIX.match(text):
            candidates.append(CLI_PREFIX.sub("", text))
    return candidates


def printed_by_the_code(line: str) -> bool:
    return any(pattern.fullmatch(text) for text in as_printed(line) for pattern in templates())


LINES = quoted_lines(DOC.read_text())


def test_the_page_quotes_log_lines() -> None:
    assert len(LINES) >= 20, "docs/troubleshooting.md should quote what operators see"


@pytest.mark.parametrize("line", LINES)
def test_every_quoted_line_is_printed_by_the_code(line: str) -> None:
    assert printed_by_the_code(line), f"no message in dex_ha/ prints {line!r}"


def test_a_made_up_line_is_caught() -> None:
    assert printed_by_the_code("raft connection to <id> at <host>:<port> failed: <error>")
    assert not printed_by_the_code("raft connection to <id> melted: <error>")
    assert not printed_by_the_code("the cluster is sad (<n> nodes)")
