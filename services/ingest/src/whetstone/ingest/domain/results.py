"""A job's results file (OpenAI's `result_files`): one CSV row per reported optimizer step, OpenAI's columns
first, then the platform's own. Pure: rows in, text out.

OpenAI's columns: `step, train_loss, train_accuracy, valid_loss, valid_mean_token_accuracy` (an empty cell
where a step has no such figure). The platform's: `epoch, learning_rate, grad_norm, tokens_seen,
tokens_per_s, step_time_s, peak_memory_mb, attempt` (the job attempt whose segment reported the step: a
step trained again after a preemption keeps the latest attempt's figures)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping

OPENAI_COLUMNS = ("step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy")
PLATFORM_COLUMNS = ("epoch", "learning_rate", "grad_norm", "tokens_seen", "tokens_per_s", "step_time_s",
                    "peak_memory_mb", "attempt")
COLUMNS = OPENAI_COLUMNS + PLATFORM_COLUMNS
RESULTS_PURPOSE = "fine-tune-results"

# job.progress field -> column
PROGRESS_FIELDS = {"loss": "train_loss", "token_accuracy": "train_accuracy", "validation_loss": "valid_loss",
                   "valid_loss": "valid_loss", "valid_mean_token_accuracy": "valid_mean_token_accuracy",
                   "epoch": "epoch", "learning_rate": "learning_rate", "grad_norm": "grad_norm",
                   "tokens_seen": "tokens_seen", "tokens_per_s": "tokens_per_s", "step_time_s": "step_time_s",
                   "peak_memory_mb": "peak_memory_mb"}
# checkpoint.written metric name -> column (the trainer's older and OpenAI's names alike)
CHECKPOINT_METRICS = {"validation_loss": "valid_loss", "valid_loss": "valid_loss",
                      "validation_token_accuracy": "valid_mean_token_accuracy",
                      "valid_mean_token_accuracy": "valid_mean_token_accuracy"}


def progress_values(fields: Mapping[str, object]) -> dict[str, float]:
    """The columns a job.progress report fills (None and non-finite figures are left out)."""
    return {col: float(v) for name, col in PROGRESS_FIELDS.items()
            if isinstance(v := fields.get(name), int | float) and not isinstance(v, bool) and math.isfinite(v)}


def checkpoint_values(metrics: Mapping[str, float]) -> dict[str, float]:
    return {col: float(metrics[name]) for name, col in CHECKPOINT_METRICS.items()
            if isinstance(metrics.get(name), int | float) and math.isfinite(metrics[name])}


def _cell(column: str, value: object) -> str:
    if value is None:
        return ""
    if column in ("step", "tokens_seen", "attempt"):
        return str(int(value))  # type: ignore[call-overload]
    return f"{float(value):.6g}"  # type: ignore[arg-type]


def results_csv(rows: Iterable[tuple[int, int, Mapping[str, float]]]) -> str:
    """(step, attempt, values) rows -> the CSV text, ordered by step."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for step, attempt, values in sorted(rows, key=lambda r: r[0]):
        cells = {**values, "step": step, "attempt": attempt}
        writer.writerow([_cell(c, cells.get(c)) for c in COLUMNS])
    return out.getvalue()


def results_filename(job_id: str) -> str:
    return f"{job_id}-results.csv"
