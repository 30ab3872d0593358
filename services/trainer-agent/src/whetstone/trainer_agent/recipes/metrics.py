"""Training metrics: peak memory, GPU utilization, the loss curve as a PNG.

    python -m whetstone.trainer_agent.recipes.metrics EVENTS.jsonl OUT.png

renders the loss curve of a job from its recipe events (or job.progress payloads).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def peak_memory_mb() -> float:
    """Peak GPU memory allocated when on CUDA, else the process's peak RSS."""
    import torch

    if torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KiB on Linux


def gpu_utilization() -> float | None:
    """Percent utilization of the current GPU (needs NVML), None on CPU or without NVML."""
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        return float(torch.cuda.utilization())
    except Exception:  # noqa: BLE001 - pynvml missing or unsupported device
        return None


def loss_points(events: Iterable[Mapping[str, Any]]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(step, train loss) and (step, validation loss) points, last value per step wins (resumes)."""
    train: dict[int, float] = {}
    validation: dict[int, float] = {}
    for event in events:
        if event.get("event", "progress") != "progress" or event.get("step") is None:
            continue
        if event.get("loss") is not None:
            train[int(event["step"])] = float(event["loss"])
        if event.get("validation_loss") is not None:
            validation[int(event["step"])] = float(event["validation_loss"])
    return sorted(train.items()), sorted(validation.items())


def render_loss_curve(events: Iterable[Mapping[str, Any]], path: Path, title: str = "loss") -> Path:
    """Write the loss curve (train per step, validation at checkpoints) to a PNG file."""
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError("rendering a loss curve needs matplotlib (pip install matplotlib)") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train, validation = loss_points(events)
    if not train:
        raise ValueError("no progress events with a loss to plot")
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    try:
        ax.plot(*zip(*train), label="train loss", linewidth=1.2)
        if validation:
            ax.plot(*zip(*validation), "o-", label="validation loss")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("loss")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m whetstone.trainer_agent.recipes.metrics")
    parser.add_argument("events", type=Path, help="JSON lines: recipe events or job.progress payloads")
    parser.add_argument("out", type=Path, help="PNG to write")
    args = parser.parse_args(argv)
    events = [json.loads(line) for line in args.events.read_text().splitlines() if line.strip()]
    print(render_loss_curve(events, args.out, title=args.events.stem), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
