"""Runs a tenant's python grader (`grade(sample, item) -> float`) in a separate, confined process.

Confinement (mode `bwrap`, the default): bubblewrap with every namespace unshared (no network, own
PID/IPC/UTS/user namespaces), an empty environment except PATH, a read-only view of /usr and the
interpreter's prefix only (no /etc, no platform files), a fresh /proc of its own PID namespace, a
private tmpfs /tmp, and resource limits set before bwrap starts (inherited by the grader): address
space (memory), CPU seconds, file size, no core files, and a process count. When the service runs
as root the grader also runs under an unprivileged uid of its own (one per slot of a range), so the
process limit counts only that grader's processes; the parent kills the whole process group when
the wall-time limit passes. The uid switch and the limits are done by util-linux's setpriv and
prlimit exec'd in front of bwrap, so the service's own (large) process is vforked, not forked; where
either tool is missing, by subprocess's user/group and a hook in the forked child. Only the standard
library is importable (`python -I -S`).

Start-up cost: the runner imports only built-in modules (marshal, math) before the grader runs; the
platform sends the call as marshal data (JSON-like values it wrote itself) and the reward comes back
as one JSON line; json and traceback are imported only to reply with an error. The reply is read as
strict JSON (never unmarshalled: the tenant's code writes it).

If bwrap is missing or cannot create its namespaces on this machine, python graders are refused
(`SandboxUnavailable`), unless the operator chose mode `unsafe` explicitly: then the grader runs in
a plain child process with the same limits and empty environment but without namespaces (it can
read what the service's user can read and reach the network). Mode `off` refuses python graders.
"""

from __future__ import annotations

import asyncio
import itertools
import marshal
import os
import resource
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, JsonValue

from .settings import PythonSandboxSettings

MAX_OUTPUT = 256 * 1024
MARSHAL_VERSION = 4   # JSON-like values only (dict, list, str, number, bool, None): read alike by every python 3
RUNNER = r"""
import marshal, math, os, sys
data = marshal.loads(sys.stdin.buffer.read())
out = os.dup(1)
null = os.open(os.devnull, os.O_WRONLY)
os.dup2(null, 1); os.dup2(null, 2)
def reply(obj):
    import json
    os.write(out, (json.dumps(obj) + "\n").encode())
try:
    scope = {"__name__": "grader"}
    exec(compile(data["source"], "grader.py", "exec"), scope)
    grade = scope.get("grade")
    if not callable(grade):
        raise NameError("the source defines no function grade(sample, item)")
    value = grade(data["sample"], data["item"])
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        reply({"error": "grade() returned %s, expected a number" % type(value).__name__})
    elif not math.isfinite(value):
        reply({"error": "grade() returned %r, expected a finite number" % value})
    else:
        os.write(out, b'{"reward": %s}\n' % repr(float(value)).encode())
except BaseException as exc:
    try:
        import traceback
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "grader.py"]
        where = "".join(traceback.format_list(frames[-5:]))
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    except BaseException:
        where, text = "", type(exc).__name__
    reply({"error": text[:2000], "traceback": where[-4000:]})
"""


class SandboxUnavailable(RuntimeError):
    """No confinement works here and the operator did not allow unconfined python graders."""


class RunnerReply(BaseModel):
    """The runner's last line on stdout: the reward, or the grader's error and its traceback."""
    model_config = ConfigDict(strict=True)
    reward: float | None = None
    error: str | None = None
    traceback: str | None = None


@dataclass(frozen=True)
class PythonOutcome:
    reward: float | None = None
    runtime_error: str | None = None     # the grader's own exception or bad return value
    server_error: str | None = None      # the sandbox's verdict: timeout, cpu_limit, killed, no_result, ...
    elapsed_s: float = 0.0


def open_to_all(path: str) -> bool:
    """Every directory on the way to `path` can be entered by any user (the grader's uid is not ours)."""
    parts = os.path.realpath(path).split("/")
    for i in range(2, len(parts)):
        if not os.stat("/".join(parts[:i]) or "/").st_mode & 0o001:
            return False
    return True


def interpreter(configured: str | None = None) -> tuple[str, str]:
    """(the interpreter the grader runs with, its installation prefix): the one configured, else this
    service's base interpreter when any user can reach it, else the system's /usr/bin/python3."""
    if configured:
        exe = os.path.realpath(configured)
        return exe, os.path.dirname(os.path.dirname(exe))
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    if open_to_all(exe) or os.getuid() != 0:
        return exe, os.path.realpath(sys.base_prefix)
    return os.path.realpath("/usr/bin/python3"), "/usr"


def bwrap_args(exe: str, prefix: str, code: str = RUNNER) -> list[str]:
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--chdir", "/tmp",
            "--clearenv", "--setenv", "PATH", "/usr/bin:/bin"]
    for top in ("/bin", "/lib", "/lib64", "/sbin"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    if not (prefix == "/usr" or prefix.startswith("/usr/")):
        args += ["--ro-bind", prefix, prefix]
    return args + ["--", exe, "-I", "-S", "-c", code]


def own_tasks() -> int:
    """Tasks (threads) of this process's real uid: what RLIMIT_NPROC counts when the uid is kept."""
    uid, count = os.getuid(), 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as fh:
                status = fh.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            count += int(fields.get("Threads", "1").strip())
    return count


class PythonSandbox:
    def __init__(self, settings: PythonSandboxSettings) -> None:
        self.settings = settings
        self.exe, self.prefix = interpreter(settings.python_executable)
        self._mode: str | None = None
        self._slots = itertools.cycle(range(settings.uid_count))
        self._gate = asyncio.Semaphore(settings.concurrency)
        self._tools = (shutil.which("setpriv"), shutil.which("prlimit"))

    # -- which confinement this machine offers --------------------------------------------------
    def mode(self) -> str:
        """'bwrap', 'unsafe' or 'none' (decided once: bwrap is tried for real)."""
        if self._mode is None:
            self._mode = self._probe()
        return self._mode

    def _probe(self) -> str:
        wanted = self.settings.python_sandbox
        if wanted == "off":
            return "none"
        if wanted == "unsafe":
            return "unsafe"
        if shutil.which("bwrap") is None:
            return "none"
        import subprocess
        try:
            probe = bwrap_args(self.exe, self.prefix, "print(6 * 7)")
            uid = self._uid()
            done = subprocess.run(probe, capture_output=True, timeout=20, env={}, preexec_fn=self._limits(None),
                                  user=uid, group=uid, extra_groups=None if uid is None else [], check=False)
            return "bwrap" if done.stdout.strip() == b"42" else "none"
        except (OSError, subprocess.SubprocessError):
            return "none"

    def require(self) -> None:
        if self.mode() == "none":
            raise SandboxUnavailable(
                "python graders are not available on this deployment: no working sandbox (bubblewrap) was found"
                + (" and python graders are switched off" if self.settings.python_sandbox == "off" else "")
                + "; the operator can install bubblewrap, or allow unconfined graders with "
                  "WHETSTONE_GRADERS_PYTHON_SANDBOX=unsafe")

    # -- one run --------------------------------------------------------------------------------
    def _uid(self) -> int | None:
        """The uid a grader runs as: one of its own when the service runs as root, else (None) ours."""
        if os.getuid() != 0 or self.settings.uid_base is None:
            return None
        return self.settings.uid_base + next(self._slots)

    def _limits(self, nproc: int | None) -> Callable[[], None]:
        memory = self.settings.memory_mb * 1024 * 1024
        cpu = self.settings.cpu_s

        def apply() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
            if nproc is not None:
                resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        return apply

    def launcher(self, uid: int | None, nproc: int | None) -> list[str] | None:
        """The same uid switch and limits as `_limits` and subprocess's user/group, done by util-linux's
        setpriv and prlimit exec'd in front of the sandbox: the child needs no Python hook, so the
        service's (large) process is vforked rather than forked. None when either tool is missing."""
        setpriv, prlimit = self._tools
        if prlimit is None or (uid is not None and setpriv is None):
            return None
        s = self.settings
        memory = s.memory_mb * 1024 * 1024
        limits = [prlimit, f"--as={memory}", f"--cpu={s.cpu_s}:{s.cpu_s + 1}", "--core=0", f"--fsize={16 << 20}",
                  "--nofile=64"] + ([] if nproc is None else [f"--nproc={nproc}"])
        switch = [] if uid is None else [str(setpriv), f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        return [*switch, *limits, "--"]

    async def run(self, source: str, sample: dict[str, JsonValue], item: object) -> PythonOutcome:
        self.require()
        async with self._gate:
            return await self._run(source, sample, item)

    async def _run(self, source: str, sample: dict[str, JsonValue], item: object) -> PythonOutcome:
        payload = marshal.dumps({"source": source, "sample": sample, "item": item}, MARSHAL_VERSION)
        uid = self._uid()
        if uid is not None:
            nproc = self.settings.max_processes
        else:   # the service's own uid: the limit counts its tasks too, so allow them plus the grader's
            nproc = own_tasks() + self.settings.max_processes
        argv = bwrap_args(self.exe, self.prefix) if self.mode() == "bwrap" else [self.exe, "-I", "-S", "-c", RUNNER]
        began = time.perf_counter()
        pipe, devnull = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
        launcher = self.launcher(uid, nproc)
        if launcher is not None:   # no hook in the child: the service's process is not forked (vfork)
            proc = await asyncio.create_subprocess_exec(
                *launcher, *argv, stdin=pipe, stdout=pipe, stderr=devnull, env={"PATH": "/usr/bin:/bin"}, cwd="/",
                start_new_session=True)
        else:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=pipe, stdout=pipe, stderr=devnull, env={"PATH": "/usr/bin:/bin"}, cwd="/",
                start_new_session=True, preexec_fn=self._limits(nproc), user=uid, group=uid,
                extra_groups=None if uid is None else [])
        try:
            out = await asyncio.wait_for(self._exchange(proc, payload), timeout=self.settings.timeout_s)
        except TimeoutError:
            kill(proc)
            await proc.wait()
            return PythonOutcome(server_error="timeout", elapsed_s=time.perf_counter() - began)
        finally:
            kill(proc)
        elapsed = time.perf_counter() - began
        code = await proc.wait()
        line = out.strip().rsplit(b"\n", 1)[-1] if out.strip() else b""
        try:
            answer: RunnerReply | None = RunnerReply.model_validate_json(line)
        except ValueError:
            answer = None
        if answer is not None and answer.reward is not None:
            return PythonOutcome(reward=answer.reward, elapsed_s=elapsed)
        if answer is not None and answer.error is not None:
            detail = answer.error + (f"\n{answer.traceback}" if answer.traceback else "")
            return PythonOutcome(runtime_error=detail.strip(), elapsed_s=elapsed)
        return PythonOutcome(server_error=exit_reason(code), elapsed_s=elapsed)

    async def _exchange(self, proc: asyncio.subprocess.Process, payload: bytes) -> bytes:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(payload)
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass
        chunks, size = [], 0
        while size < MAX_OUTPUT:
            chunk = await proc.stdout.read(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)[:MAX_OUTPUT]


def kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass


def exit_reason(code: int) -> str:
    if code in (-signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGXCPU, 128 + signal.SIGKILL):
        return "cpu_limit" if code in (-signal.SIGXCPU, 128 + signal.SIGXCPU) else "killed"
    if code < 0:
        return f"killed_by_signal_{-code}"
    return f"no_result_exit_{code}"
