"""Checkpoint components shared by every recipe.

- Resumable checkpoints are HF Trainer `checkpoint-N` directories (adapter or weights,
  optimizer, scheduler, RNG states, trainer state); the platform adds `whetstone_state.json`
  (kind, data position, batch geometry) when one is saved, and reads the geometry back on
  resume (a segment may have halved its micro-batch after running out of memory).
- The final artifact is written to `output_dir/final` atomically (staged, then renamed):
  adapter (or weights), tokenizer and chat template, optionally a merged model, the training
  summary, the loss curve and `environment.lock.json` (this child process's own packages, the
  platform's commit and the image digest: the environment the weights were made in). Never a pickle.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError
from whetstone.runtime.environment import capture_environment

from ..domain.recipe_io import Progress
from .hyperparams import Hyperparameters

if TYPE_CHECKING:
    from whetstone.contracts.enums import Method

    from .modeling import QuantizationSummary
    from .vision import ImageSettings

log = logging.getLogger("whetstone.trainer_agent.recipes")

CHECKPOINT_STATE_FILE = "whetstone_state.json"
TRAINER_STATE_FILE = "trainer_state.json"   # HF Trainer's own
FINAL_DIR = "final"
SINGLE_WEIGHTS = "model.safetensors"  # full weights in one file, as transformers saves a small model


# ------------------------------------------------------------------ resumable checkpoints


class DataPosition(BaseModel):
    epoch_index: int
    optimizer_steps_into_epoch: int
    micro_batches_into_epoch: int
    examples_into_epoch: int
    examples_per_epoch: int
    shuffle_seed: int


class CheckpointState(BaseModel):
    """whetstone_state.json: where in the data a checkpoint stands, with which batch geometry."""

    kind: str
    step: int
    epoch: float | None
    method: str
    micro_batch_size: int
    gradient_accumulation_steps: int
    effective_batch: int
    data_position: DataPosition
    tokens_seen: int | None
    train_file: str


def checkpoint_state(state: Any, *, kind: str, method: str, hp: Hyperparameters, examples_per_epoch: int,
                     train_file: str) -> CheckpointState:
    """Where in the data the trainer `state` stands, with the geometry of `hp`."""
    n = examples_per_epoch
    micro, accumulation = int(hp.batch_size), hp.gradient_accumulation_steps
    steps_per_epoch = math.ceil(math.ceil(n / micro) / accumulation)
    in_epoch = state.global_step % steps_per_epoch
    return CheckpointState(
        kind=kind, step=state.global_step, epoch=state.epoch, method=method, micro_batch_size=micro,
        gradient_accumulation_steps=accumulation, effective_batch=micro * accumulation,
        data_position=DataPosition(
            epoch_index=state.global_step // steps_per_epoch, optimizer_steps_into_epoch=in_epoch,
            micro_batches_into_epoch=in_epoch * accumulation,
            examples_into_epoch=min(n, in_epoch * accumulation * micro), examples_per_epoch=n,
            shuffle_seed=hp.seed),
        tokens_seen=state.num_input_tokens_seen, train_file=train_file)


def write_checkpoint_state(checkpoint: Path, info: CheckpointState) -> None:
    (checkpoint / CHECKPOINT_STATE_FILE).write_text(info.model_dump_json(indent=1) + "\n")


def checkpoint_geometry(resume: Path | None) -> tuple[int, int] | None:
    """(micro-batch, accumulation) the checkpoint was written with, or None when unknown."""
    path = resume / CHECKPOINT_STATE_FILE if resume else None
    if path is None or not path.is_file():
        return None
    try:
        state = CheckpointState.model_validate_json(path.read_text())
    except ValidationError:
        return None
    return state.micro_batch_size, state.gradient_accumulation_steps


class TrainerStateFile(BaseModel):
    """HF Trainer's `trainer_state.json` of a checkpoint, as far as the platform reads it."""

    global_step: int


def checkpoint_step(checkpoint: Path | None) -> int:
    if checkpoint is None:
        return 0
    return TrainerStateFile.model_validate_json((checkpoint / TRAINER_STATE_FILE).read_text()).global_step


# ------------------------------------------------------------------ the final artifact


@dataclass(frozen=True)
class TrainingSummary:
    """`whetstone_training.json` of a final artifact: what was trained, on what, and how it went (the
    registry reads a vision adapter's `vision` settings from it)."""

    job_id: str
    base_model: str
    method: Method
    hyperparameters: Hyperparameters
    base_model_parameters: int
    quantization: QuantizationSummary | None   # what the loaded base weights really were
    global_step: int
    train_loss: float | None
    tokens: int
    non_padding_fraction: float | None
    vision: ImageSettings | None = None        # a vision adapter's processor and image settings

    def to_json(self) -> str:
        return json.dumps(asdict(self, dict_factory=_summary_fields), indent=2) + "\n"


def _summary_fields(items: list[tuple[str, object]]) -> dict[str, object]:
    """`asdict`'s dict factory: the hyperparameters' `explicit` set (which the user gave) and an absent
    `vision` are left out of the file."""
    return {key: value for key, value in items if key != "explicit" and not (key == "vision" and value is None)}


def write_final_artifact(trainer, tokenizer, output_dir: Path, *, summary: TrainingSummary,
                         progress: list[Progress], title: str,
                         merge: Callable[[Path, Path], None] | None = None,
                         max_shard_bytes: int | None = None) -> Path:
    """output_dir/final, atomically; `merge(adapter_dir, out_dir)` also writes a merged model; full weights
    are split into shards of at most `max_shard_bytes` when it is given."""
    final = output_dir / FINAL_DIR
    staging = output_dir / f"{FINAL_DIR}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    trainer.model.config.use_cache = True  # the artifact is for inference
    trainer.save_model(str(staging))
    tokenizer.save_pretrained(str(staging))  # tokenizer.json + chat_template.jinja, whatever the trainer did
    (staging / "training_args.bin").unlink(missing_ok=True)  # a pickle: keep it out of the artifact
    if max_shard_bytes is not None:
        reshard_full_weights(staging, max_shard_bytes)
    if merge is not None:
        merge(staging, staging / "merged")
    (staging / "whetstone_training.json").write_text(summary.to_json())
    capture_environment("trainer").write(staging)
    _save_loss_curve(progress, staging / "loss_curve.png", title)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    return final


def reshard_full_weights(directory: Path, max_shard_bytes: int) -> list[str]:
    """Full weights saved as one `model.safetensors` rewritten as `model-0000i-of-0000N.safetensors` shards
    of at most `max_shard_bytes` each plus `model.safetensors.index.json` (one file stays one file when
    it fits). An adapter, or weights transformers already sharded, are left as they are. The shard names
    written, in order."""
    from huggingface_hub import save_torch_state_dict
    from safetensors.torch import load_file

    single = directory / SINGLE_WEIGHTS
    if not single.exists() or (directory / "adapter_config.json").exists():
        return []
    state = load_file(single)
    single.unlink()
    save_torch_state_dict(state, directory, max_shard_size=max_shard_bytes, metadata={"format": "pt"})
    index = directory / f"{SINGLE_WEIGHTS}.index.json"
    if not index.exists():
        return [SINGLE_WEIGHTS]
    return sorted(set(json.loads(index.read_text())["weight_map"].values()))


def remove_partial_artifact(output_dir: Path) -> None:
    shutil.rmtree(output_dir / f"{FINAL_DIR}.partial", ignore_errors=True)


def merged_writer(base_model: str, tokenizer, device_map: dict[str, str] | None = None) -> Callable[[Path, Path], None]:
    """merge_and_unload onto a full-precision copy of the base (also for QLoRA adapters); `device_map`:
    where to load the base (default: CPU memory, beside a trainer that still holds the GPU)."""

    def merge(adapter_dir: Path, out: Path) -> None:
        from peft import PeftModel
        from whetstone.modelkit.loading import load_model

        from .modeling import compute_dtype

        base = load_model(base_model, dtype=compute_dtype(), **({"device_map": device_map} if device_map else {}))
        merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
        merged.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))

    return merge


def training_summary(*, job_id: str, base_model: str, method: Method, hp: Hyperparameters, base_parameters: int,
                     quantization: QuantizationSummary | None, trainer, train_loss: float | None,
                     non_padding_fraction: float | None, vision: ImageSettings | None = None) -> TrainingSummary:
    return TrainingSummary(
        job_id=job_id, base_model=base_model, method=method, hyperparameters=hp, base_model_parameters=base_parameters,
        quantization=quantization, global_step=trainer.state.global_step, train_loss=train_loss,
        tokens=trainer.state.num_input_tokens_seen,
        non_padding_fraction=round(non_padding_fraction, 6) if non_padding_fraction is not None else None,
        vision=vision)


def mean_train_loss(trainer, train_output) -> float | None:
    """Mean logged loss over ALL steps, including those of earlier (preempted) segments."""
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    if losses:
        return sum(losses) / len(losses)
    return train_output.training_loss if train_output else None


def _save_loss_curve(progress: list[Progress], path: Path, title: str) -> None:
    from .metrics import render_loss_curve

    try:
        render_loss_curve(progress, path, title=title)
    except (RuntimeError, ValueError) as exc:
        log.warning("no loss curve: %s", exc)
