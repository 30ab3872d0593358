"""The platform as separate OS processes on the embedded stack, and the faults the chaos driver injects.

Each service runs as it does in production (`python -m whetstone.<svc>`), two trainer-agent processes
act as two CPU nodes. The test process makes itself a child subreaper, so a training launcher orphaned
by a killed agent is still ours to find and end at teardown."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

SERVICES = ("ingest", "scheduler", "trainer-agent", "eval", "registry", "metering")
NODES = ("node-a", "node-b")
SCHEMA = {"ingest": "ingest", "scheduler": "scheduler", "trainer-agent": "trainer_agent", "eval": "eval",
          "registry": "registry", "metering": "metering"}
PR_SET_CHILD_SUBREAPER = 36


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def become_subreaper() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children first found through /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def signal_tree(pid: int, sig: signal.Signals) -> None:
    for p in [pid, *descendants(pid)]:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


@dataclass
class Proc:
    name: str           # a service, or "trainer-agent/<node>"
    module: str
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen | None = None
    starts: int = 0
    held_down: bool = False  # killed by the driver, which restarts it itself: the supervisor leaves it alone

    def start(self) -> None:
        self.held_down = False
        self.starts += 1
        with self.log.open("ab") as out:
            out.write(f"\n===== start {self.starts} at {time.time():.3f} =====\n".encode())
            out.flush()
            # dies with the test process, even one killed by SIGKILL (whetstone.runtime.pdeathsig)
            argv = [sys.executable, "-m", "whetstone.runtime.pdeathsig", str(os.getpid()), "--",
                    sys.executable, "-m", self.module]
            self.popen = subprocess.Popen(argv, env=self.env, stdout=out,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def last_lines(self, n: int = 12) -> list[str]:
        """The end of this lifetime's log (what it said before it exited)."""
        text = self.log.read_bytes()[-64 * 1024:].decode("utf-8", errors="replace")
        lifetime = text.rsplit(f"===== start {self.starts} at", 1)[-1]
        return [line[:300] for line in lifetime.strip().splitlines()[1:][-n:]]

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer would: no drain, no goodbye."""
        self.held_down = True
        if self.popen is not None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait()


@dataclass
class Processes:
    """The six services (the trainer agent twice: two nodes) with their environment."""

    base_env: dict[str, str]
    log_dir: Path
    procs: dict[str, Proc] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for svc in SERVICES:
            module = f"whetstone.{SCHEMA[svc]}"
            if svc == "trainer-agent":
                for node in NODES:
                    env = {**self.base_env, "WHETSTONE_TRAINER_AGENT_NODE_ID": node,
                           "WHETSTONE_TRAINER_AGENT_HTTP_PORT": str(free_port())}
                    self.procs[f"trainer-agent/{node}"] = Proc(f"trainer-agent/{node}", module, env,
                                                               self.log_dir / f"trainer-agent-{node}.log")
            else:
                env = {**self.base_env, f"WHETSTONE_{SCHEMA[svc].upper()}_HTTP_PORT": str(free_port())}
                self.procs[svc] = Proc(svc, module, env, self.log_dir / f"{svc}.log")

    def port(self, name: str) -> int:
        svc = name.split("/")[0]
        return int(self.procs[name].env[f"WHETSTONE_{SCHEMA[svc].upper()}_HTTP_PORT"])

    async def ready(self, name: str, timeout_s: float = 120.0) -> bool:
        """True once the process answers on its HTTP port (healthy or degraded: it is up and consuming)."""
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=3) as c:
            while time.monotonic() < deadline:
                try:
                    await c.get(f"http://127.0.0.1:{self.port(name)}/healthz")
                    return True
                except httpx.HTTPError:
                    await asyncio.sleep(0.5)
        return False

    def start_all(self) -> None:
        for p in self.procs.values():
            p.start()

    def check_alive(self) -> list[dict]:
        """Processes that died on their own (not by the driver): each is restarted; returns, for each,
        its name, exit code and the last lines it logged (the reason, for the report)."""
        exits = []
        for name, p in self.procs.items():
            if p.alive() or p.held_down:
                continue
            exits.append({"name": name, "at": time.strftime("%H:%M:%S"), "code": p.popen.returncode if p.popen else None,
                          "last_lines": p.last_lines()})
            p.start()
        return exits

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.alive():
                signal_tree(p.popen.pid, signal.SIGCONT)
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in self.procs.values():
            if p.popen is None:
                continue
            try:
                p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_tree(p.popen.pid, signal.SIGKILL)
                p.popen.wait()
        # launchers orphaned by a killed agent were re-parented to this (subreaper) process
        for pid in descendants(os.getpid()):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_text(errors="replace").split("\0")
                if "python" in Path(argv[0]).name:  # not the stack's servers: the stack stops those
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass
