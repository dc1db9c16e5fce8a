"""DEX_HA_LONG is read one way by every test: on only for "1" (as scripts/test reads it);
"0" and the empty string leave the default suite (one reader used to treat "0" as on)."""

from __future__ import annotations

import pytest

from harness.long_runs import long_runs


@pytest.mark.parametrize(("value", "on"), [("1", True), (" 1 ", True), ("0", False), ("", False), ("yes", False)])
def test_only_one_turns_the_long_runs_on(value: str, on: bool) -> None:
    assert long_runs({"DEX_HA_LONG": value}) is on


def test_unset_is_off() -> None:
    assert long_runs({}) is False
