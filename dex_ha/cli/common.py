"""What every `dex-ha` command shares: its failure type, exit codes and option parsers."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any, TypeAlias

from dex_ha.client.env import DEFAULT_URL, TOKEN_VAR, URLS_VAR

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_NO_NODE = 3

# How much of a tool's arguments, output or error one table cell shows.
CELL_CHARS = 60


class CommandFailed(Exception):
    """An expected failure: one line for stderr and the exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# argparse's type of the object that add_subparsers returns (private, so named once here).
# Generic only in typeshed, not at run time: hence the quoted alias.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def remote_options(default: Any = None) -> argparse.ArgumentParser:
    """--url and --token, shared by the commands that talk to a running cluster.

    `default=argparse.SUPPRESS` is for a subcommand of a command that takes them too
    (`members --url X list`): otherwise the subcommand's None would overwrite X.
    """
    remote = argparse.ArgumentParser(add_help=False, argument_default=default)
    remote.add_argument(
        "--url",
        action="append",
        metavar="URL",
        help=f"a node URL; repeat, or separate with commas, for several (default: ${URLS_VAR}, else {DEFAULT_URL})",
    )
    remote.add_argument("--token", help=f"a bearer token (default: ${TOKEN_VAR})")
    return remote


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def dash(value: Any) -> str:
    """A table cell: "-" for None."""
    return "-" if value is None else str(value)


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """Left-aligned columns, two spaces apart."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [headers, *rows]]
    return "\n".join(lines)


def when(ms: Any) -> str:
    """A leader timestamp (ms since the epoch) as UTC time, "-" when there is none."""
    if not isinstance(ms, int | float):
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def short(value: Any, limit: int = CELL_CHARS) -> str:
    """A value on one line, cut to `limit` characters ("-" for None)."""
    if value is None:
        return "-"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
