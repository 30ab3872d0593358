"""`whet jobs follow`: a live progress bar (status, step, loss, ETA) and an optional loss curve."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .client import Api

TERMINAL = ("succeeded", "failed", "cancelled")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class LossCurve:
    """(step, loss) points from the job's progress and its events, one per step."""

    def __init__(self) -> None:
        self.points: dict[int, float] = {}

    def add(self, step: Any, loss: Any) -> None:
        if isinstance(step, int) and _number(loss) is not None:
            self.points[step] = float(loss)

    def add_events(self, events: list[dict]) -> None:
        for e in events:
            data = e.get("data") or {}
            self.add(data.get("step"), data.get("loss", data.get("train_loss")))

    def save_png(self, path: Path, title: str) -> Path:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415

        steps = sorted(self.points)
        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        ax.plot(steps, [self.points[s] for s in steps], marker="." if len(steps) < 60 else None)
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return path


def eta_text(job: dict, started: dict[str, float], now: float) -> str:
    """From the platform's estimate when it has one, else from the step rate seen so far."""
    finish = job.get("estimated_finish")
    if isinstance(finish, (int, float)) and finish > time.time():
        return f"{int(finish - time.time())}s"
    p = job.get("progress") or {}
    step, total = p.get("step") or 0, p.get("total_steps")
    if not total or not step:
        return "-"
    if "t0" not in started:
        started.update(t0=now, s0=step)
        return "-"
    done = step - started["s0"]
    if done <= 0:
        return "-"
    return f"{int((total - step) * (now - started['t0']) / done)}s"


def follow(api: Api, job_id: str, *, timeout_s: float = 3600, poll_s: float = 0.5, quiet: bool = False,
           curve: LossCurve | None = None) -> dict:
    """Poll the job until it is terminal; a rich progress bar unless `quiet`."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    deadline = time.monotonic() + timeout_s
    rate: dict[str, float] = {}
    columns = (TextColumn("[bold]{task.fields[status]:<18}"), BarColumn(),
               TextColumn("step {task.completed}/{task.total}"), TextColumn("loss {task.fields[loss]}"),
               TextColumn("ETA {task.fields[eta]}"), TimeElapsedColumn())
    with Progress(*columns, disable=quiet, transient=False) as bar:
        task = bar.add_task("train", total=None, status="submitted", loss="-", eta="-")
        while True:
            job = api.get(f"/fine_tuning/jobs/{job_id}")
            p = job.get("progress") or {}
            loss = _number(p.get("loss"))
            if curve is not None:
                curve.add(p.get("step"), loss)
            status = job["status"] if job.get("state") in (None, job["status"]) else f"{job['status']}/{job['state']}"
            bar.update(task, total=p.get("total_steps"), completed=p.get("step") or 0, status=status,
                       loss=f"{loss:.4f}" if loss is not None else "-", eta=eta_text(job, rate, time.monotonic()))
            if job["status"] in TERMINAL:
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['status']} after {timeout_s}s")
            time.sleep(poll_s)


def all_events(api: Api, job_id: str, limit: int = 500) -> list[dict]:
    """Every event of the job, oldest first."""
    out = list(api.pages(f"/fine_tuning/jobs/{job_id}/events", limit=limit))
    def order(e: dict) -> tuple:
        digits = str(e.get("id", "")).rpartition("-")[2]
        return (e.get("created_at") or 0, int(digits) if digits.isdigit() else 0)

    return sorted(out, key=order)
