"""What the benches share: CPU readings from /proc, a probe of the machine's speed, a
list-of-integers flag, and table cells."""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Callable

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process so far, from /proc (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of proc(5)


def cpu_pressure_us() -> int | None:
    """Microseconds so far in which some runnable task waited for a CPU (Linux PSI,
    /proc/pressure/cpu "some total"); None where the kernel does not offer it."""
    try:
        with open("/proc/pressure/cpu") as f:
            match = re.search(r"total=(\d+)", f.readline())
    except OSError:
        return None
    return int(match.group(1)) if match else None


CPU_PROBE_ITERATIONS = 300_000  # about 30 ms of pure Python on a small VM


def cpu_probe_ms(runs: int = 3) -> float:
    """Milliseconds that a fixed piece of pure-Python work takes now, the fastest of `runs`.

    On a small shared VM the same code runs up to twice as fast at one moment as a few
    minutes later (other guests share the caches and the host's clock speed, which "steal"
    does not show). A row whose probe took longer ran on a slower machine: compare rows with
    this in view, or interleave them (--rounds)."""
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        table: dict[int, int] = {}
        for i in range(CPU_PROBE_ITERATIONS):
            table[i & 1023] = table.get(i & 511, 0) + i
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 1)


def ratio(a: float | None, b: float | None, digits: int) -> float | None:
    """a / b rounded to `digits`; None when either is missing or b is 0."""
    return None if a is None or not b else round(a / b, digits)


def positive_ints(flag: str) -> Callable[[str], list[int]]:
    """An argparse type: a comma-separated list of positive integers, errors naming `flag`."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag}: a comma-separated list of integers, got {text!r}") from None
        if not values or any(v < 1 for v in values):
            raise argparse.ArgumentTypeError(f"{flag}: positive integers, got {text!r}")
        return values

    return parse


def fmt(value: float | int | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def fmt_pct(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction * 100:.0f}%"


def rss_bytes(pid: int) -> int:
    """Resident memory of a process now (VmRSS from /proc), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (from /proc/PID/task/*/children), e.g. a server and the
    worker processes it forked."""
    tree, pending = [], [pid]
    while pending:
        current = pending.pop()
        tree.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children") as f:
                    pending += [int(child) for child in f.read().split()]
            except OSError:
                pass
    return tree
