"""`whet jobs follow`: a live progress bar (status, step, loss, ETA) and an optional loss curve."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .api_objects import Job, JobEvent, Progress
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

    def add_events(self, events: list[JobEvent]) -> None:
        for e in events:
            if e.data is not None:
                self.add(e.data.step, e.data.loss if e.data.loss is not None else e.data.train_loss)

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


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


@dataclass
class StepRate:
    """What the follower keeps between updates to estimate the time left."""
    ema: float | None = None        # the trainer's seconds per step, averaged over the updates
    ema_step: int | None = None     # the step whose time `ema` took in last
    t0: float | None = None         # when this follower first saw a step (monotonic seconds)
    s0: int = 0                     # that step


def eta_text(job: Job, rate: StepRate, now: float) -> str:
    """Time left, from real step times only: the trainer's measured seconds per step when it reports
    them (an exponential average over the updates, kept in `rate`), else the step rate this follower
    has seen. Nothing before the first step (set-up, queue)."""
    p = job.progress or Progress()
    step, total = p.step, p.total_steps
    if job.status != "running" or not isinstance(step, int) or step <= 0 or not total:
        return "-"
    if total <= step:
        return "0:00"
    step_time = _number(p.step_time_s)
    if step_time:   # smoothed over the updates seen (a busy machine's step times jump)
        if rate.ema_step != step or rate.ema is None:
            rate.ema = step_time if rate.ema is None else 0.3 * step_time + 0.7 * rate.ema
            rate.ema_step = step
        return _clock((total - step) * rate.ema)
    if rate.t0 is None:
        rate.t0, rate.s0 = now, step
        return "-"
    done = step - rate.s0
    if done <= 0:
        return "-"
    return _clock((total - step) * (now - rate.t0) / done)


def status_text(job: Job) -> str:
    return job.status if job.state in (None, job.status) else f"{job.status}/{job.state}"


def progress_text(job: Job, eta: str, elapsed_s: float) -> str:
    """One update: status, step, loss, ETA (labelled), elapsed (labelled)."""
    p = job.progress or Progress()
    step, total = p.step, p.total_steps
    if isinstance(step, int):
        where = f"step {step}/{total}" if total else f"step {step}"
    else:
        where = "waiting for the first step"
    loss = _number(p.loss)
    parts = [f"{status_text(job):<22}", where, f"loss {loss:.4f}" if loss is not None else "",
             f"ETA {eta}" if eta != "-" else "", f"elapsed {_clock(elapsed_s)}"]
    return "  ".join(x for x in parts if x)


def follow(api: Api, job_id: str, *, timeout_s: float = 3600, poll_s: float = 0.5, quiet: bool = False,
           curve: LossCurve | None = None, stream=None) -> tuple[Job, dict]:
    """Poll the job until it is terminal; the terminal job and the API's JSON of it. On a terminal: a
    progress bar; otherwise one plain line per update (status, step or loss changed); nothing when
    `quiet`. Progress goes to stderr."""
    import sys  # noqa: PLC0415

    out = stream or sys.stderr
    interactive = not quiet and out.isatty()
    began = time.monotonic()
    deadline = began + timeout_s
    rate = StepRate()
    last_printed: tuple | None = None
    bar = task = None
    if interactive:
        from rich.console import Console  # noqa: PLC0415
        from rich.progress import BarColumn, Progress, TextColumn  # noqa: PLC0415

        bar = Progress(BarColumn(), TextColumn("{task.fields[line]}"), console=Console(file=out), transient=False)
        bar.start()
        task = bar.add_task("train", total=None, line="submitted")
    try:
        while True:
            raw = api.get(f"/fine_tuning/jobs/{job_id}")
            job = Job.from_api(raw)
            p = job.progress or Progress()
            loss = _number(p.loss)
            if curve is not None:
                curve.add(p.step, loss)
            now = time.monotonic()
            line = progress_text(job, eta_text(job, rate, now), now - began)
            if bar is not None:
                step = p.step if isinstance(p.step, int) else 0
                bar.update(task, total=p.total_steps or None, completed=step, line=line)
            elif not quiet:
                key = (status_text(job), p.step, loss)
                if key != last_printed:
                    last_printed = key
                    print(line, file=out, flush=True)
            if job.status in TERMINAL:
                return job, raw
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job.status} after {timeout_s}s")
            time.sleep(poll_s)
    finally:
        if bar is not None:
            bar.stop()


def all_events(api: Api, job_id: str, limit: int = 500) -> list[tuple[JobEvent, dict]]:
    """Every event of the job, oldest first: each parsed, with the API's JSON of it."""
    out = [(JobEvent.from_api(raw), raw) for raw in api.pages(f"/fine_tuning/jobs/{job_id}/events", limit=limit)]

    def order(item: tuple[JobEvent, dict]) -> tuple:
        e = item[0]
        digits = str(e.id if e.id is not None else "").rpartition("-")[2]
        return (e.created_at or 0, int(digits) if digits.isdigit() else 0)

    return sorted(out, key=order)
