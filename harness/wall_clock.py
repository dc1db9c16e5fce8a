"""A steppable wall clock for one real process: libfaketime, changed at run time.

    clock = SteppableWallClock(tmp_path / "faketime")
    proc = subprocess.Popen(cmd, env={**os.environ, **clock.env()})   # or DevProcess(extra_env=...)
    clock.step(3600)      # the process's CLOCK_REALTIME jumps an hour ahead, at once
    clock.step(-7200)     # steps add up: now an hour behind

Only the wall clock moves: `FAKETIME_DONT_FAKE_MONOTONIC=1` keeps CLOCK_MONOTONIC and
CLOCK_BOOTTIME real, so what a process measures as elapsed time is untouched (as with an NTP
step). The offset is read from a file at every clock read (`FAKETIME_NO_CACHE=1`).

Known limit of libfaketime 0.9.10 (Debian 12) with a real monotonic clock: Python's
`time.sleep` fails with EINVAL (it sleeps with an absolute CLOCK_MONOTONIC deadline, which
the library mistranslates). asyncio, thread waits and SQLite are unaffected; the server
never calls time.sleep. `available()` says why not when the library is missing.
"""

from __future__ import annotations

from pathlib import Path

LIBFAKETIME_PATHS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
)


def libfaketime() -> Path | None:
    """The library's path, or None when it is not installed (Debian package `faketime`)."""
    return next((Path(p) for p in LIBFAKETIME_PATHS if Path(p).exists()), None)


def unavailable_reason() -> str | None:
    """Why no steppable clock can be had here (None: it can)."""
    if libfaketime() is None:
        return "libfaketime is not installed (Debian package faketime; scripts/test installs it as root)"
    return None


class SteppableWallClock:
    """The wall-clock offset of the processes started with `env()`; `step()` moves it."""

    def __init__(self, offset_file: Path) -> None:
        self.offset_file = offset_file
        self.offset_s = 0
        self._write()

    def env(self) -> dict[str, str]:
        """Environment variables that make a new process read its wall clock through us."""
        library = libfaketime()
        if library is None:
            raise RuntimeError(unavailable_reason())
        return {
            "LD_PRELOAD": str(library),
            "FAKETIME_TIMESTAMP_FILE": str(self.offset_file),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

    def step(self, seconds: int) -> None:
        """Step the wall clock of every process using this clock by `seconds` (either way)."""
        self.offset_s += int(seconds)
        self._write()

    def _write(self) -> None:
        tmp = self.offset_file.with_name(self.offset_file.name + ".tmp")
        tmp.write_text(f"{self.offset_s:+d}\n")
        tmp.replace(self.offset_file)  # a reader never sees a half-written offset
