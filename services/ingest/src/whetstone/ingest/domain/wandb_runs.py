"""A job's W&B offline run (OpenAI's `integrations: [{"type": "wandb", ...}]`), as the platform writes it.

The platform holds no W&B key, so the run is written OFFLINE: a `wandb` run directory (`offline-run-*`)
packed into `<job>-wandb-offline.tar.gz`, a second result file of the job that the tenant uploads with
`wandb sync`. Pure: what goes into the run (config, tags, name, one history row per step, summary) is decided
here from the job's spec (job.queued) and the step figures the results CSV is made of."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from whetstone.contracts.integrations import WandbIntegration

from .results import COLUMNS

WANDB_FILE_SUFFIX = "-wandb-offline.tar.gz"
# figures of a results row that are W&B history (the CSV's columns but the step, which is W&B's own step, and
# the attempt, a bookkeeping number)
HISTORY_KEYS = tuple(c for c in COLUMNS if c not in ("step", "attempt"))
MAX_TAG = 64          # W&B's limit on one tag's length


class WandbPlan(BaseModel):
    """What job.queued said about the run: the job's `wandb` block and its resolved spec."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    wandb: WandbIntegration
    base_model: str
    base_model_sha256: str
    method: str
    hyperparameters: dict[str, JsonValue] = Field(default_factory=dict)
    dataset_id: str
    suffix: str | None = None

    @property
    def run_name(self) -> str:
        """The block's `name`, else the job id (as OpenAI names the run)."""
        return self.wandb.name or self.job_id

    @property
    def tags(self) -> list[str]:
        """The tenant's tags, then the platform's own (like OpenAI's `openai/finetune`, `openai/{base}`,
        `openai/{job}`), each cut to W&B's 64 characters, no repeats."""
        own = ["whetstone/finetune", f"whetstone/{self.base_model}", f"whetstone/{self.job_id}"]
        out: list[str] = []
        for tag in [*self.wandb.tags, *own]:
            if (cut := tag[:MAX_TAG]) not in out:
                out.append(cut)
        return out

    @property
    def config(self) -> dict[str, JsonValue]:
        """The run's config: the job, its base model (pinned sha), method and resolved hyperparameters."""
        return {"job_id": self.job_id, "base_model": self.base_model, "base_model_sha256": self.base_model_sha256,
                "method": self.method, "dataset_id": self.dataset_id, "suffix": self.suffix,
                "hyperparameters": self.hyperparameters}


class WandbRunInput(BaseModel):
    """Everything the SDK process needs to write the run (stdin of `adapters/wandb_offline.py`)."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    project: str
    entity: str | None
    name: str
    tags: list[str]
    config: dict[str, JsonValue]
    history: list[tuple[int, dict[str, float]]]
    summary: dict[str, float | int]


def history(rows: Iterable[tuple[int, int, Mapping[str, float]]]) -> list[tuple[int, dict[str, float]]]:
    """(step, attempt, figures) rows of the results table -> (step, the W&B history row), by step: the
    same figures as the results CSV."""
    return [(step, {k: float(values[k]) for k in HISTORY_KEYS if k in values})
            for step, _attempt, values in sorted(rows, key=lambda r: r[0])]


def summary(steps: list[tuple[int, dict[str, float]]]) -> dict[str, float | int]:
    """The run's summary: each figure's last value, the steps reported, and the best validation loss."""
    out: dict[str, float | int] = {"steps": len(steps)}
    if steps:
        out["last_step"] = steps[-1][0]
    for _step, values in steps:
        out.update(values)
    valid = [v["valid_loss"] for _s, v in steps if "valid_loss" in v]
    if valid:
        out["best_valid_loss"] = min(valid)
    return out


def run_input(plan: WandbPlan, rows: Iterable[tuple[int, int, Mapping[str, float]]]) -> WandbRunInput:
    steps = history(rows)
    return WandbRunInput(run_id=wandb_run_id(plan.job_id), project=plan.wandb.project, entity=plan.wandb.entity,
                         name=plan.run_name, tags=plan.tags, config=plan.config, history=steps,
                         summary=summary(steps))


def wandb_run_id(job_id: str) -> str:
    """The W&B run id: the job id where W&B accepts it (letters, digits, `-` and `_`), else a hash of it."""
    ok = job_id and len(job_id) <= 64 and all(c.isascii() and (c.isalnum() or c in "-_") for c in job_id)
    return job_id if ok else hashlib.sha256(job_id.encode()).hexdigest()[:32]


def wandb_file_id_for(job_id: str) -> str:
    """The id of the job's W&B offline-run file, a file of the job's tenant."""
    return "file-wb-" + hashlib.sha256(f"wandb\x00{job_id}".encode()).hexdigest()[:24]


def wandb_filename(job_id: str) -> str:
    return f"{job_id}{WANDB_FILE_SUFFIX}"
