"""The one polling helper: returns what the check found, waits for async checks, fails
at its deadline with a message that says what it waited for, and refuses bad input."""

from __future__ import annotations

import time

import pytest

from harness.waiting import eventually


async def test_returns_the_first_truthy_value_of_a_plain_check() -> None:
    calls = []

    def check() -> int | None:
        calls.append(1)
        return len(calls) if len(calls) >= 3 else None

    assert await eventually(check, "the third call", deadline_s=5, interval_s=0.001) == 3


async def test_awaits_an_async_check() -> None:
    state = {"n": 0}

    async def check() -> str | None:
        state["n"] += 1
        return "done" if state["n"] == 2 else None

    assert await eventually(check, "the second call", deadline_s=5, interval_s=0.001) == "done"


async def test_fails_at_the_deadline_naming_what_it_waited_for() -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError, match="timed out after 0.1 s waiting for the impossible"):
        await eventually(lambda: False, "the impossible", deadline_s=0.1, interval_s=0.01)
    assert 0.1 <= time.monotonic() - started < 2.0


async def test_without_a_description_the_message_names_the_check_and_its_line() -> None:
    with pytest.raises(AssertionError, match=r"<lambda> \(test_waiting\.py:\d+\)"):
        await eventually(lambda: 0, deadline_s=0.05, interval_s=0.01)


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"deadline_s": 0}, "deadline_s"),
        ({"interval_s": -1}, "interval_s"),
    ],
)
async def test_refuses_a_deadline_or_interval_that_is_not_positive(kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        await eventually(lambda: True, "anything", **kwargs)


async def test_refuses_a_check_that_is_not_callable() -> None:
    with pytest.raises(TypeError, match="check"):
        await eventually(True, "anything")  # type: ignore[arg-type]
