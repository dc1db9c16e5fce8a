"""The Raft layer reads one clock, CLOCK_BOOTTIME where Linux has it: a suspended leader
must find its lease over when it resumes (CLOCK_MONOTONIC stops during suspend)."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from dex_ha.raft import clock, node

RAFT_DIR = Path(clock.__file__).parent


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="CLOCK_BOOTTIME is Linux only")
def test_now_ms_reads_boottime_on_linux() -> None:
    assert clock.clock_name() == "boottime"
    before = time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1_000_000
    now = clock.now_ms()
    after = time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1_000_000
    assert before <= now <= after


def test_without_boottime_it_falls_back_to_the_monotonic_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock, "_BOOTTIME", None)
    assert clock.clock_name() == "monotonic"
    before = time.monotonic_ns() // 1_000_000
    assert before <= clock.now_ms() <= time.monotonic_ns() // 1_000_000


def test_the_node_loop_times_the_lease_with_that_clock() -> None:
    assert vars(node)["now_ms"] is clock.now_ms  # the name node.py imports, not one it exports
    # No other clock in the Raft layer: a lease computed on one clock and checked on
    # another would be meaningless. (perf_counter only times fsyncs and applies: metrics, warnings, the apply pace.)
    for path in sorted(RAFT_DIR.glob("*.py")):
        if path.name != "clock.py":
            assert not re.search(r"\bmonotonic|clock_gettime|time\.time\(", path.read_text()), path.name
