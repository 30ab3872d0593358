"""Training processes: each in its own session (process group), tied to the agent's life."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

from whetstone.runtime import pdeathsig

STDOUT_LINE_LIMIT = 1 << 22


async def spawn(argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> asyncio.subprocess.Process:
    """stdout is a pipe (the JSON-lines events), stderr goes to `log_path`; the child leads a new
    session, so one killpg reaches it and whatever it starts in its group."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return await asyncio.create_subprocess_exec(
            *pdeathsig.wrap(list(argv)),  # tied to the agent's life, the platform's one way
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=log, env=dict(env),
            start_new_session=True, limit=STDOUT_LINE_LIMIT)


def signal_group(pid: int, sig: int) -> bool:
    """Signal the process group led by `pid`; False when it is already gone."""
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks after boot): tells a recycled pid from ours."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def kill_orphan(pid: int | None, ticks: int | None) -> bool:
    """SIGKILL the group of a training process an earlier agent left behind, if it still lives."""
    if not pid or ticks is None or start_ticks(pid) != ticks:
        return False
    return signal_group(pid, signal.SIGKILL)


def log_tail(path: Path, chars: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(f.seek(0, os.SEEK_END) - chars, 0))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def snapshot(src: Path, dest: Path) -> Path:
    """A hard-linked copy of a checkpoint directory: the trainer may rotate (delete) its own
    checkpoints while the upload runs; the snapshot's links keep the files (copies across devices)."""
    shutil.rmtree(dest, ignore_errors=True)
    for p in sorted(src.rglob("*")):
        target = dest / p.relative_to(src)
        if p.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(p, target)
        except OSError:
            shutil.copy2(p, target)
    return dest


def port_in_use(port: int) -> bool:
    """Whether another process holds TCP `port` on this machine: a listening socket bound to it
    refuses this bind (SO_REUSEADDR, as torch's TCPStore binds, so a closed socket's TIME_WAIT
    does not count)."""
    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:   # no IPv6 on this machine
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError:
                return True
    return False
