"""Named crash points for crash tests, armed by an environment variable.

``DEX_HA_FAILPOINTS="storage.save.after-write@3,server.complete.after-commit"`` makes the
process ``os._exit(FAILPOINT_EXIT_CODE)`` the 3rd time it passes the first point and the
1st time it passes the second (``@N`` is optional, default 1; the count is per process).
Unset, a point costs one dict lookup. The points are listed where they are:
`dex_ha.raft.storage.FAILPOINTS`, `dex_ha.server.node.SERVER_FAILPOINTS` and
`dex_ha.worker.runner.WORKER_FAILPOINTS`.

This module imports only the standard library and sits below every layer, so the Raft
storage, the server and the Worker SDK all use it without importing one another.

``name:eio@N`` makes the point raise ``OSError(EIO)`` instead of exiting: an I/O error the
code must survive, or stop on cleanly (a failed fsync).
"""

from __future__ import annotations

import errno
import os

FAILPOINT_ENV = "DEX_HA_FAILPOINTS"
FAILPOINT_EXIT_CODE = 99


class Failpoints:
    """The crash points armed for this process (the spec comes from FAILPOINT_ENV)."""

    def __init__(self, spec: str | None = None) -> None:
        spec = os.environ.get(FAILPOINT_ENV, "") if spec is None else spec
        self._remaining: dict[str, int] = {}
        self._raises: set[str] = set()  # points armed with ":eio"
        for item in filter(None, (s.strip() for s in spec.split(","))):
            point, _, count = item.partition("@")
            name, _, action = point.partition(":")
            if action not in ("", "eio"):
                raise ValueError(f"{FAILPOINT_ENV}: unknown action {action!r} in {item!r} (known: eio)")
            self._remaining[name] = int(count) if count else 1
            if action == "eio":
                self._raises.add(name)

    def armed(self, name: str) -> bool:
        """Whether `name` is armed and not yet reached (to skip work that only serves a point)."""
        return self._remaining.get(name, 0) > 0

    def hit(self, name: str) -> None:
        if name not in self._remaining:
            return
        self._remaining[name] -= 1
        if self._remaining[name] != 0:
            return
        if name in self._raises:
            raise OSError(errno.EIO, f"failpoint {name}: injected I/O error")
        os._exit(FAILPOINT_EXIT_CODE)
