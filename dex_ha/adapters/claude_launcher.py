"""Start the Claude Code CLI so that it dies with the Worker that started it (Linux).

    python claude_launcher.py PID_FILE PARENT_PID CLI_PATH [CLI arguments...]

Why: the CLI is a child process of the Worker. When the Worker is SIGKILLed, an ordinary
child lives on, and the CLI goes on with its agent loop by itself: it finishes its shell
command, calls the model again, runs more tools, while dex-ha already runs the same segment
again on another Worker. That breaks "the segment's inline work runs again": it would run
twice *at once*.

So the launcher asks the kernel for a signal when its parent dies (PR_SET_PDEATHSIG), starts
the CLI in a process group of its own, and on that signal (or SIGTERM from the SDK) kills the
whole group: the CLI and the commands it started. It writes its pid to PID_FILE, so the
Worker can stop a segment at once the same way (SIGTERM). The CLI inherits the launcher's stdin,
stdout and stderr, so the SDK talks to it as if it had started it itself.

Standard library only, and it imports nothing of dex-ha: it starts fast.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _ask_for_parent_death_signal() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: claude_launcher.py PID_FILE PARENT_PID CLI_PATH [ARGS...]", file=sys.stderr)
        return 2
    pid_file, parent_pid, command = argv[0], int(argv[1]), argv[2:]
    _ask_for_parent_death_signal()
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        return 1
    children: list[subprocess.Popen[bytes]] = []

    def kill_group(signum: int, frame: object) -> None:
        for child in children:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os._exit(128 + signum)

    # The handlers come first: a signal between the start and the handlers would leave the CLI.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, kill_group)
    children.append(subprocess.Popen(command, start_new_session=True))
    with open(pid_file, "w") as out:
        out.write(str(os.getpid()))
    code = children[0].wait()
    return code if code >= 0 else 128 - code  # killed by a signal: the shell's convention


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
