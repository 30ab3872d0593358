"""Exec a command that dies with its parent (Linux PR_SET_PDEATHSIG): the one way the platform
ties a child process's life to its parent's (the trainer agent's launchers, the dev stack's servers).

    python -m whetstone.runtime.pdeathsig PARENT_PID -- ARGV...

A separate exec step rather than a `preexec_fn`: the parent has threads (S3 transfers, asyncio
executors), and running Python between fork and exec in a threaded process can deadlock. The
death signal survives execve (and is set after any change of user the spawner made), so the
command is SIGKILLed the moment its parent dies, even by SIGKILL. The signal is tied to the
parent *thread* that forked: spawn from a thread that lives as long as the process."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
_LIBC: ctypes.CDLL | None
try:  # loaded at import, in the parent: a forked child must not load libraries
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover  (not Linux)
    _LIBC = None


def die_with_parent(parent_pid: int) -> bool:
    """In a child: ask the kernel to SIGKILL us when the parent (thread) dies. False when the parent
    is already gone (the caller must exit). Safe in a `preexec_fn`: no allocation-heavy Python."""
    if _LIBC is not None:
        try:
            _LIBC.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except AttributeError:  # no prctl: callers clean up orphans by pid instead
            pass
    return os.getppid() == parent_pid


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: python -m whetstone.runtime.pdeathsig PARENT_PID -- ARGV...\n")
        raise SystemExit(2)
    parent_pid, command = int(argv[0]), argv[2:]
    if not die_with_parent(parent_pid):  # the parent died before prctl took effect
        raise SystemExit(137)
    os.execvp(command[0], command)


def wrap(argv: list[str], parent_pid: int | None = None) -> list[str]:
    """`argv` run through this shim, tied to `parent_pid` (default: this process)."""
    return [sys.executable, "-m", "whetstone.runtime.pdeathsig",
            str(parent_pid if parent_pid is not None else os.getpid()), "--", *argv]


if __name__ == "__main__":
    main(sys.argv[1:])
