"""Training metrics: per-step progress (throughput), peak memory, GPU utilization, the loss curve as a PNG."""

from __future__ import annotations

import resource
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..domain.recipe_io import Progress
from ..domain.telemetry import mfu

# what methods log besides the loss, and the Progress field each becomes
LOGGED_EXTRAS = {"mean_token_accuracy": "mean_token_accuracy", "rewards/accuracies": "rewards_accuracies",
                 "rewards/margins": "rewards_margins", "nll_loss": "nll_loss", "reward": "reward",
                 "reward_std": "reward_std", "grader_errors": "grader_errors"}
SUB_REWARD = "sub_reward/"   # reinforcement: a multi grader's sub-rewards, by name


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

    def measure(self, args: Any, state: Any, logs: Mapping[str, Any]) -> Progress:
        now, tokens, step = time.perf_counter(), state.num_input_tokens_seen, state.global_step
        last_time, last_tokens, last_step = self._last
        elapsed = max(now - last_time, 1e-9)
        samples = (step - last_step) * args.per_device_train_batch_size * args.gradient_accumulation_steps
        samples *= max(args.world_size, 1)
        self._last = (now, tokens, step)
        tokens_per_s = round((tokens - last_tokens) / elapsed, 1)
        return Progress(
            step=step,
            total_steps=state.max_steps,
            epoch=round(state.epoch or 0.0, 4),
            loss=logs["loss"],   # the trainer's log of an optimizer step (the caller checked it has one)
            grad_norm=logs.get("grad_norm"),
            learning_rate=logs.get("learning_rate"),
            tokens_per_s=tokens_per_s,
            step_time_s=round(elapsed / (step - last_step), 4) if step > last_step else None,
            samples_per_s=round(samples / elapsed, 2),
            tokens_seen=tokens,
            peak_memory_mb=peak_memory_mb(),
            # tokens seen are summed over the processes: the peak is that of all the job's GPUs
            mfu=mfu(self.params, tokens_per_s, self.gpu_type, max(args.world_size, 1)),
            gpu_utilization=gpu_utilization(),
            sub_rewards={k.removeprefix(SUB_REWARD): float(v) for k, v in logs.items() if k.startswith(SUB_REWARD)},
            **{field: logs[key] for key, field in LOGGED_EXTRAS.items() if key in logs},
        )


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


def loss_points(progress: Iterable[Progress]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(step, train loss) and (step, validation loss) points, last value per step wins (resumes)."""
    train: dict[int, float] = {}
    validation: dict[int, float] = {}
    for p in progress:
        if p.loss is not None:
            train[p.step] = p.loss
        if p.validation is not None and p.validation.loss is not None:
            validation[p.step] = p.validation.loss
    return sorted(train.items()), sorted(validation.items())


def render_loss_curve(progress: Iterable[Progress], path: Path, title: str = "loss") -> Path:
    """Write the loss curve (train per step, validation at checkpoints) to a PNG file."""
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError("rendering a loss curve needs matplotlib (pip install matplotlib)") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train, validation = loss_points(progress)
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
