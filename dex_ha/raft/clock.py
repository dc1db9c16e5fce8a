"""The one clock of the Raft layer: election timers, heartbeats and the leader lease.

CLOCK_MONOTONIC stops while the machine is suspended. A leader that is suspended and
resumed would then think no time passed and keep serving on a lease the rest of the
cluster has long since waited out (it elected another leader meanwhile): two active
nodes. CLOCK_BOOTTIME (Linux) is monotonic too and keeps counting during suspend, so
the lease has ended when the leader wakes up. Elsewhere we fall back to the monotonic
clock, which has the same problem on suspend.

Everything that compares a time with a lease time (`RaftCore.tick`, `lease_valid`,
`lease_remaining_ms`) must read this clock.
"""

from __future__ import annotations

import time

# Resolved once: a constant, not state.
_BOOTTIME: int | None = getattr(time, "CLOCK_BOOTTIME", None)


def now_ms() -> int:
    """Milliseconds on CLOCK_BOOTTIME where there is one, else on the monotonic clock."""
    if _BOOTTIME is not None:
        return time.clock_gettime_ns(_BOOTTIME) // 1_000_000
    return time.monotonic_ns() // 1_000_000


def clock_name() -> str:
    """Which clock now_ms() reads (for logs and tests)."""
    return "boottime" if _BOOTTIME is not None else "monotonic"
