"""Training metrics: per-step progress (throughput), peak memory, GPU utilization, the loss curve as a PNG.

    python -m whetstone.trainer_agent.recipes.metrics EVENTS.jsonl OUT.png

renders the loss curve of a job from its recipe events (or job.progress payloads).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..domain.telemetry import mfu


LOGGED_EXTRAS = ("mean_token_accuracy", "rewards/accuracies", "rewards/margins", "nll_loss", "reward", "reward_std",
                 "grader_errors")
LOGGED_PREFIXES = ("sub_reward/",)   # reinforcement: a multi grader's sub-rewards by name


class ProgressMeter:
    """One `progress` record per logged optimizer step: loss, learning rate, throughput since the
    previous record, memory."""

    def __init__(self) -> None:
        self._last = (time.perf_counter(), 0, 0)  # time, tokens seen, global step
        self.params: int | None = None      # the whole model's parameters (frozen base included)
        self.gpu_type: str | None = None    # the CUDA device's name; None on CPU (no MFU)

    def start(self, state, model=None) -> None:
        self._last = (time.perf_counter(), state.num_input_tokens_seen, state.global_step)
        if model is not None:
            # ZeRO-3 partitions parameters: their full size is `ds_numel`
            self.params = sum(getattr(p, "ds_numel", None) or p.numel() for p in model.parameters())
        self.gpu_type = cuda_device_name()

    def measure(self, args, state, logs: Mapping[str, Any]) -> dict[str, Any]:
        now, tokens, step = time.perf_counter(), state.num_input_tokens_seen, state.global_step
        last_time, last_tokens, last_step = self._last
        elapsed = max(now - last_time, 1e-9)
        samples = (step - last_step) * args.per_device_train_batch_size * args.gradient_accumulation_steps
        samples *= max(args.world_size, 1)
        self._last = (now, tokens, step)
        progress = {
            "step": step,
            "total_steps": state.max_steps,
            "epoch": round(state.epoch or 0.0, 4),
            "loss": logs["loss"],
            "grad_norm": logs.get("grad_norm"),
            "learning_rate": logs.get("learning_rate"),
            "tokens_per_s": round((tokens - last_tokens) / elapsed, 1),
            "step_time_s": round(elapsed / (step - last_step), 4) if step > last_step else None,
            "samples_per_s": round(samples / elapsed, 2),
            "tokens_seen": tokens,
            "peak_memory_mb": peak_memory_mb(),
        }
        for key in LOGGED_EXTRAS:
            if key in logs:
                progress[key.replace("/", "_")] = logs[key]
        for key in logs:
            if key.startswith(LOGGED_PREFIXES):
                progress[key] = logs[key]
        # tokens seen are summed over the processes: the peak is that of all the job's GPUs
        progress["mfu"] = mfu(self.params, progress["tokens_per_s"], self.gpu_type, max(args.world_size, 1))
        utilization = gpu_utilization()
        if utilization is not None:
            progress["gpu_utilization"] = utilization
        return progress


def peak_memory_mb() -> float:
    """Peak GPU memory allocated when on CUDA, else the process's peak RSS."""
    import torch

    if torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KiB on Linux


def cuda_device_name() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        return torch.cuda.get_device_name()
    except Exception:  # noqa: BLE001 - a device that cannot be queried has no known peak
        return None


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
