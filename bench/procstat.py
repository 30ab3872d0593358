"""Where a benchmark's CPU went, read from /proc (Linux): per process, per Postgres cluster, per
machine. CPU figures are seconds (user + system) so far; a benchmark takes two readings and
subtracts them."""

from __future__ import annotations

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (field 3, the state, is index 0), or None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def proc_cpu_s(pid: int) -> float:
    fields = _stat(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / TICK


def cluster_cpu_s(postmaster: int) -> float:
    """A Postgres cluster's CPU: the postmaster's, every child's it has reaped (backends, autovacuum
    workers that came and went) and every live child's (backends, io workers, WAL writer, checkpointer,
    background writer, autovacuum)."""
    own = _stat(postmaster)
    if own is None:
        return 0.0
    return sum(int(x) for x in own[11:15]) / TICK + sum(proc_cpu_s(pid) for pid in children_of(postmaster))


def children_of(parent: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[1]) == parent:
                out.add(int(entry.name))
    return out


def parent_of(pid: int) -> int:
    fields = _stat(pid)
    return 0 if fields is None else int(fields[1])


def sched_s(pid: int) -> tuple[float, float]:
    """Seconds the process's main thread has run on a CPU, and waited runnable for one (/proc schedstat):
    with the wall time, they tell how long the service sat idle waiting on IO (the time to win back)
    from how long it waited for a core that something else held (the machine's load)."""
    try:
        run_ns, wait_ns = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[:2]
    except (OSError, ValueError):  # gone, or a kernel without schedstats
        return 0.0, 0.0
    return int(run_ns) / 1e9, int(wait_ns) / 1e9


def thread_time(before: tuple[float, float], after: tuple[float, float], wall_s: float) -> dict[str, float]:
    on_cpu, waiting = after[0] - before[0], after[1] - before[1]
    return {"on_cpu": round(on_cpu / wall_s, 3), "waiting_for_cpu": round(waiting / wall_s, 3),
            "idle": round(max(wall_s - on_cpu - waiting, 0.0) / wall_s, 3)}


def machine_cpu_s() -> dict[str, float]:
    """CPU seconds every core of the machine has spent so far (/proc/stat's first line): running
    processes (user, nice, system), serving interrupts (irq, softirq: the loopback network's packets
    among them), and stolen by the hypervisor (steal)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(x) / TICK for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9])
    return {"processes": user + nice + system, "interrupts": irq + softirq, "steal": steal}


def process_table() -> dict[int, tuple[str, float]]:
    """Every process's name (its command line's first 40 characters: Postgres names its helpers there,
    a kernel thread is [its comm]) and CPU seconds so far."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                name = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:40]
                name = name or f"[{(entry / 'comm').read_text().strip()}]"
            except OSError:
                continue
            out[int(entry.name)] = (name, proc_cpu_s(int(entry.name)))
    return out


def top_others(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], counted: set[int],
               wall_s: float, n: int = 5) -> list[list]:
    """The n processes (summed by name) outside `counted` that took the most CPU between two process
    tables: [name, CPU-seconds per second of wall time]."""
    by_name: dict[str, float] = {}
    for pid, (name, cpu) in after.items():
        if pid not in counted:
            by_name[name] = by_name.get(name, 0.0) + cpu - before.get(pid, (name, 0.0))[1]
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:n]
    return [[name, round(cpu / wall_s, 3)] for name, cpu in top if cpu > 0]
