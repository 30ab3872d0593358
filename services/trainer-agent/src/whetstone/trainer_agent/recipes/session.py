"""The steps every recipe shares around its trainer, as one component each recipe holds (never a
base class): the cheap checks and the base model of `setup`, the model rebuilt after an
out-of-memory error, `train`, the final artifact and `cleanup`.

What differs per method (rows to examples, the trainer class, validation, what the `completed`
event adds) stays in the recipe modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from whetstone.contracts.enums import CheckpointKind

from ..domain.recipe_io import Checkpoint
from .callbacks import RunState, TrainingMonitor, platform_callback
from .checkpointing import (
    CheckpointState,
    checkpoint_geometry,
    checkpoint_state,
    mean_train_loss,
    merged_writer,
    remove_partial_artifact,
    training_summary,
    write_final_artifact,
)
from .data import read_rows
from .faults import Faults
from .gang_check import check_gang_versions
from .hyperparams import Hyperparameters, plan_batch
from .modeling import (
    BaseModelFacts,
    check_sequence_length,
    deepspeed_zero_init,
    describe_base,
    load_base_config,
    load_base_model,
    load_base_tokenizer,
    micro_batch_token_budget,
)
from .protocol import EventStream, PreemptionFlag
from .spec import RecipeConfig, read_resume_state
from .trainers import finish_trainer, free_memory
from .validation import Validator

if TYPE_CHECKING:
    from .vision import ImageSettings


class TrainingSession:
    """One segment's run of a recipe: its config, hyperparameters, tokenizer, base model facts,
    the current trainer, and what outlives a trainer (`run`: an OOM retry builds a new one)."""

    def __init__(self, cfg: RecipeConfig, events: EventStream, preemption: PreemptionFlag,
                 faults: Faults | None = None, *, packing: bool, vision: bool = False,
                 load_as: str | None = None) -> None:
        self.cfg = cfg
        self.load_as = load_as or cfg.method   # how the base loads ("qlora": 4-bit NF4), default the method's
        self.hp: Hyperparameters = cfg.hyperparameters
        self.events = events
        self.preemption = preemption
        self.faults = faults or Faults()
        self.packing = packing
        self.vision = vision  # a vision-language base (vision.py's recipe)
        self.run = RunState()
        self.tokenizer = None
        self.trainer = None
        self.train_output = None
        self.base: BaseModelFacts | None = None
        self._zero_init = None

    # ------------------------------------------------------------------ setup

    def read_inputs(self) -> tuple[list[tuple[int, Any]], list[tuple[int, Any]] | None]:
        """Cheap checks first (user errors fail fast): the resume directory, the data (training,
        validation), the tokenizer and the sequence length. Returns the line-numbered rows."""
        cfg = self.cfg
        read_resume_state(cfg.resume_from)
        train_rows = read_rows(cfg.train_file, cfg.method)
        validation_rows = read_rows(cfg.validation_file, cfg.method) if cfg.validation_file else None
        self.tokenizer = load_base_tokenizer(cfg.base_model)
        check_sequence_length(load_base_config(cfg.base_model), self.hp.max_seq_len)
        return train_rows, validation_rows

    def load_model(self, example_lengths: list[int]):
        """The base model; then the hyperparameters resolved for its size and the batch planned."""
        cfg = self.cfg
        self._zero_init = deepspeed_zero_init(cfg.deepspeed, cfg.zero_init)  # alive while models load
        model = load_base_model(cfg.base_model, self.load_as, packing=self.packing, vision=self.vision)
        self.base = describe_base(model)
        self.hp = plan_batch(self.hp.resolved(cfg.method, self.base.parameters), example_lengths,
                             micro_batch_token_budget(self.hp), checkpoint_geometry(cfg.resume_from))
        return model

    def reload_model(self, hp: Hyperparameters):
        """After an out-of-memory error: drop the trainer, free its memory, a fresh base model."""
        self.run.checkpoint_seconds += getattr(self.trainer, "checkpoint_seconds", 0.0)
        self.trainer = None
        free_memory()
        self.hp = hp
        return load_base_model(self.cfg.base_model, self.load_as, packing=self.packing, vision=self.vision)

    def callbacks(self, validate: Validator | None, examples_per_epoch: int,
                  validate_every: int | None = None) -> list:
        """The platform's monitor (progress, cadence, SIGTERM, divergence) as trainer callbacks;
        `validate_every`: steps between validations besides those at checkpoints."""
        cfg, hp = self.cfg, self.hp

        def describe(state: Any, kind: str) -> CheckpointState:
            return checkpoint_state(state, kind=kind, method=cfg.method, hp=hp,
                                    examples_per_epoch=examples_per_epoch, train_file=cfg.train_file.name)

        return [platform_callback(TrainingMonitor(self.events, self.preemption, self.run, hp, validate, describe,
                                                  validate_every))]

    def install(self, trainer) -> None:
        self.trainer = finish_trainer(trainer, self.faults)

    # ------------------------------------------------------------------ train

    def train(self, resume_from: Path | None) -> bool:
        """Run (or resume) training; True when stopped by SIGTERM. A gang first checks that every
        node runs the same platform build (`gang_check`)."""
        check_gang_versions()
        self.train_output = self.trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        return self.run.emergency_checkpoint is not None

    def train_loss(self) -> float | None:
        return mean_train_loss(self.trainer, self.train_output)

    # ------------------------------------------------------------------ save_checkpoint

    def save_final(self, *, merge: bool, non_padding_fraction: float | None,
                   vision: ImageSettings | None = None) -> Path:
        """output_dir/final: adapter (or weights), tokenizer (or processor), optionally merged, summary
        (with a vision adapter's image settings), loss curve."""
        cfg = self.cfg
        if not self.trainer.is_world_process_zero():
            # another node's rank: it joins save_model's collectives (ZeRO-3 gathers the weights) and
            # writes nothing; rank 0 writes the artifact and reports it
            self.trainer.save_model(str(cfg.output_dir / "final.rank-local"))
            return cfg.output_dir
        summary = training_summary(
            job_id=cfg.job_id, base_model=cfg.base_model, method=cfg.method, hp=self.hp,
            base_parameters=self.base.parameters, quantization=self.base.quantization, trainer=self.trainer,
            train_loss=self.train_loss(), non_padding_fraction=non_padding_fraction, vision=vision)
        final = write_final_artifact(self.trainer, self.tokenizer, cfg.output_dir, summary=summary,
                                     progress=self.run.progress, title=f"{cfg.job_id} ({cfg.method})",
                                     merge=merged_writer(cfg.base_model, self.tokenizer) if merge else None,
                                     max_shard_bytes=cfg.max_shard_bytes)
        self.events.emit(Checkpoint(kind=CheckpointKind.FINAL, step=self.trainer.state.global_step, path=final))
        return final

    # ------------------------------------------------------------------ cleanup

    def cleanup(self) -> None:
        remove_partial_artifact(self.cfg.output_dir)
        self.trainer = None
