"""What the trainer agent and its training child say to each other, one typed model for both ends. Pure.

- `TrainingConfig` / `MergeConfig`: the CONFIG.json the agent writes into a segment's scratch
  directory (adapters/workspace.py, usecases/merges.py) and the child reads (recipes/spec.py,
  recipes/merge.py).
- `ChildEvent`: the JSON lines the child prints on stdout (recipes/protocol.py writes them), one
  model per `event`; the agent parses each line once with `parse_event` and dispatches on its type
  (usecases/segments.py).

Producers build the models with their constructors (an unknown field is an error); readers parse
tolerantly (`TOLERANT`: a field this side does not know is ignored).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, JsonValue, TypeAdapter, ValidationError
from whetstone.contracts import TOLERANT, ReinforcementSpec
from whetstone.contracts.base import Contract
from whetstone.contracts.enums import CheckpointKind, ErrorClass, Method

from .deepspeed_json import DeepSpeedConfig

# ------------------------------------------------------------------ CONFIG.json


class RecipeReinforcement(ReinforcementSpec):
    """The config's `reinforcement` object: the job's resolved spec, and `reward_sign` (-1 trains
    against the grader: tests and benches that plant a candidate whose reward was wrong)."""

    reward_sign: float = 1.0


class DistributedSummary(Contract):
    """The agent's distributed plan, recorded in the config for whoever reads the scratch directory."""

    world_size: int
    zero_stage: int | None = None
    reasons: list[str] = Field(default_factory=list)


class TrainingConfig(Contract):
    """A training segment's config. `hyperparameters` is the job's raw object: the recipe validates
    it and fills the defaults only it can know (hyperparams.py), telling the user's values apart by
    their presence. `deepspeed` is DeepSpeed's own config, inline or the path of its JSON file."""

    job_id: str = Field(min_length=1)
    base_model: str = Field(min_length=1)
    train_file: Path
    output_dir: Path
    method: Method = Method.LORA
    hyperparameters: dict[str, JsonValue] = Field(default_factory=dict)
    validation_file: Path | None = None
    resume_from: Path | None = None
    reinforcement: RecipeReinforcement | None = None
    deepspeed: DeepSpeedConfig | Path | None = None
    zero_init: bool = False
    distributed: DistributedSummary | None = None
    max_shard_bytes: int | None = Field(default=None, gt=0)  # the final full weights' shard size; None: transformers'


class MergeConfig(Contract):
    """A merge segment's config: the base the agent resolved and checked against the job's pinned
    sha256, and the adapter it downloaded and verified against its manifest."""

    job_id: str = Field(min_length=1)
    base_model: str = Field(min_length=1)
    adapter_dir: Path
    output_dir: Path
    merge_id: str | None = None
    model_id: str | None = None


# ------------------------------------------------------------------ stdout events


class Validation(Contract):
    """Validation over the whole validation file (at a checkpoint, or at the end), per data kind."""

    loss: float | None = None
    tokens: int | None = None
    mean_token_accuracy: float | None = None
    reward: float | None = None           # reinforcement: mean reward on the validation prompts
    reward_std: float | None = None
    samples: int | None = None

    def metrics(self) -> dict[str, float]:
        """As the job's metrics name them: `validation_<field>`, measured ones only."""
        return {f"validation_{k}": float(v) for k, v in self.model_dump(exclude_none=True).items()}


class _ChildEvent(Contract):
    job_id: str | None = None   # set by the child's event stream once the config is read
    time: float | None = None   # time.time() when written


class Started(_ChildEvent):
    event: Literal["started"] = "started"
    total_steps: int | None = None
    resumed_from_step: int | None = None
    micro_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None


class Progress(_ChildEvent):
    """One logged optimizer step: the trainer's own figures, throughput since the previous record,
    memory, and what the method logs (token accuracy, preference rewards, GRPO rewards)."""

    event: Literal["progress"] = "progress"
    step: int
    total_steps: int | None = None
    epoch: float | None = None
    loss: float | None = None
    grad_norm: float | None = None
    learning_rate: float | None = None
    tokens_per_s: float | None = None
    step_time_s: float | None = None
    samples_per_s: float | None = None
    tokens_seen: int | None = None
    peak_memory_mb: float | None = None
    mfu: float | None = None
    gpu_utilization: float | None = None
    mean_token_accuracy: float | None = None
    nll_loss: float | None = None
    rewards_accuracies: float | None = None
    rewards_margins: float | None = None
    reward: float | None = None
    reward_std: float | None = None
    grader_errors: int | None = None
    sub_rewards: dict[str, float] = Field(default_factory=dict)   # a multi grader's sub-rewards by name
    validation: Validation | None = None                          # at a checkpoint step


class Checkpoint(_ChildEvent):
    event: Literal["checkpoint"] = "checkpoint"
    kind: CheckpointKind
    step: int
    path: Path
    validation: Validation | None = None

    def metrics(self) -> dict[str, float]:
        """The checkpoint's own metrics (checkpoint.written): its validation loss and token accuracy."""
        v = self.validation.metrics() if self.validation else {}
        return {k: v[k] for k in ("validation_loss", "validation_mean_token_accuracy") if k in v}


class Outcome(Contract):
    """What a method adds to its `completed` event."""

    non_padding_fraction: float | None = None
    images: int | None = None
    ref_log_probs_s: float | None = None
    reward_first: float | None = None
    reward_last: float | None = None
    generations: int | None = None


class Completed(_ChildEvent):
    event: Literal["completed"] = "completed"
    step: int = 0
    train_loss: float | None = None
    tokens: int | None = None
    runtime_s: float | None = None
    train_runtime_s: float | None = None
    checkpoint_s: float | None = None
    training_loop_s: float | None = None
    micro_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    oom_retries: int | None = None
    merge_s: float | None = None
    outcome: Outcome = Field(default_factory=Outcome)
    validation: Validation | None = None

    def metrics(self) -> dict[str, float | int]:
        """Every figure of the run, flat, as the job's metrics (job.completed)."""
        own = self.model_dump(exclude_none=True, exclude={"event", "job_id", "time", "outcome", "validation"})
        return {**own, **self.outcome.model_dump(exclude_none=True),
                **(self.validation.metrics() if self.validation else {})}


class Merged(_ChildEvent):
    event: Literal["merged"] = "merged"
    path: Path
    files: int
    merge_s: float


class Preempted(_ChildEvent):
    event: Literal["preempted"] = "preempted"
    step: int | None = None
    checkpoint: Path | None = None
    sigterm_to_checkpoint_s: float | None = None
    reason: str | None = None


class Failed(_ChildEvent):
    event: Literal["failed"] = "failed"
    error_class: ErrorClass = ErrorClass.PLATFORM
    code: str = "training_failed"
    message: str = "training failed"
    advice: list[str] = Field(default_factory=list)

    def full_message(self) -> str:
        """The message with its suggested changes (JobFailedV1 has no field of its own for them)."""
        if not self.advice:
            return self.message
        return f"{self.message} Suggested changes: {'; '.join(self.advice)}."


class OomRetry(_ChildEvent):
    event: Literal["oom_retry"] = "oom_retry"
    attempt: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    resume_step: int | None = None
    message: str = ""


ChildEvent = Annotated[Started | Progress | Checkpoint | Completed | Merged | Preempted | Failed | OomRetry,
                       Field(discriminator="event")]
TERMINAL = (Completed, Preempted, Failed)
_EVENT: TypeAdapter[ChildEvent] = TypeAdapter(ChildEvent)


def parse_event(line: bytes | str) -> ChildEvent | None:
    """One stdout line as its event; None for a line that is not one (the agent skips it)."""
    try:
        return _EVENT.validate_json(line, context=TOLERANT)
    except ValidationError:
        return None
