"""Preference-tuning recipe, read top to bottom: setup -> train -> save_checkpoint -> cleanup.

    dpo    trl DPOTrainer on a LoRA adapter (reference = the adapter disabled); the reference
           log-probs are computed once, kept with every checkpoint and reused on resume
    orpo   trl.experimental.orpo ORPOTrainer on a LoRA adapter (no reference model)

Data: {"prompt", "chosen", "rejected"} pairs, tokenized by trl. Components as for SFT:
`data`, `modeling`, `trainers`, `callbacks`, `checkpointing`, `validation`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .callbacks import RunState, TrainingMonitor, platform_callback
from .checkpointing import (
    checkpoint_geometry, checkpoint_state, mean_train_loss, merged_writer, remove_partial_artifact, training_summary,
    write_final_artifact,
)
from .data import read_rows
from .faults import Faults
from .hyperparams import Hyperparameters, plan_batch
from .modeling import (
    BaseModelFacts, check_sequence_length, deepspeed_zero_init, describe_base, load_base_config, load_base_model,
    load_base_tokenizer, lora_config, micro_batch_token_budget,
)
from .protocol import EventStream, PreemptionFlag
from .spec import RecipeConfig, read_resume_state
from .trainers import (
    dpo_trainer_class, finish_trainer, free_memory, orpo_trainer_class, read_ref_log_probs, training_arguments,
    write_ref_log_probs,
)
from .validation import preference_loss

METHODS = ("dpo", "orpo")


class PreferenceRecipe:
    """setup -> train -> save_checkpoint -> cleanup, for dpo / orpo."""

    def __init__(self, cfg: RecipeConfig, events: EventStream, preemption: PreemptionFlag,
                 faults: Faults | None = None) -> None:
        self.cfg = cfg
        self.hp: Hyperparameters = cfg.hyperparameters
        self.events = events
        self.preemption = preemption
        self.faults = faults or Faults()
        self.run = RunState()  # what outlives one Trainer (an OOM retry builds a new one)
        self.tokenizer = None
        self.trainer = None
        self.train_output = None
        self.train_pairs: list[dict[str, Any]] = []
        self.validation_pairs: list[dict[str, Any]] = []
        self.ref_log_probs: dict[str, Any] | None = None  # DPO: stored with the checkpoint we resume from
        self.base: BaseModelFacts | None = None
        self._zero_init = None

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        """Cheap checks first (user errors fail fast), then tokenizer, data, model, trainer."""
        cfg = self.cfg
        read_resume_state(cfg.resume_from)
        self.train_pairs = [pair for _, pair in read_rows(cfg.train_file, cfg.method)]
        if cfg.validation_file:
            self.validation_pairs = [pair for _, pair in read_rows(cfg.validation_file, cfg.method)]
        self.tokenizer = load_base_tokenizer(cfg.base_model)
        check_sequence_length(load_base_config(cfg.base_model), self.hp.max_seq_len)
        if cfg.method == "dpo":
            self.ref_log_probs = read_ref_log_probs(cfg.resume_from, cfg.data_fingerprint())
        self._zero_init = deepspeed_zero_init(cfg.deepspeed, cfg.zero_init)  # alive while models load
        model = load_base_model(cfg.base_model, cfg.method, packing=False)
        self.base = describe_base(model)
        self.hp = plan_batch(self.hp.resolved(cfg.method, self.base.parameters), [],
                             micro_batch_token_budget(self.hp), checkpoint_geometry(cfg.resume_from))
        self.trainer = self._build_trainer(model)

    def rebuild(self, hp: Hyperparameters) -> None:
        """A fresh model and trainer with other batch geometry (after an out-of-memory error)."""
        self.run.checkpoint_seconds += getattr(self.trainer, "checkpoint_seconds", 0.0)
        self.ref_log_probs = getattr(self.trainer, "ref_log_probs", None) or self.ref_log_probs
        self.trainer = None
        free_memory()
        self.hp = hp
        self.trainer = self._build_trainer(load_base_model(self.cfg.base_model, self.cfg.method, packing=False))

    def _build_trainer(self, model):
        from datasets import Dataset
        from transformers import set_seed

        set_seed(self.hp.seed)  # LoRA init
        monitor = TrainingMonitor(self.events, self.preemption, self.run, self.hp,
                                  self._validate if self.validation_pairs else None, self._checkpoint_state)
        common = dict(model=model, train_dataset=Dataset.from_list(self.train_pairs),
                      eval_dataset=Dataset.from_list(self.validation_pairs) if self.validation_pairs else None,
                      processing_class=self.tokenizer, peft_config=lora_config(model, self.hp),
                      callbacks=[platform_callback(monitor)])
        args = training_arguments(self.hp, output_dir=self.cfg.output_dir, deepspeed=self.cfg.deepspeed)
        trainer = self._dpo_trainer(args, common) if self.cfg.method == "dpo" else self._orpo_trainer(args, common)
        return finish_trainer(trainer, self.faults)

    def _dpo_trainer(self, args: dict[str, Any], common: dict[str, Any]):
        from trl import DPOConfig

        config = DPOConfig(**args, beta=self.hp.beta, max_length=self.hp.max_seq_len,
                           precompute_ref_log_probs=self.hp.precompute_ref_log_probs)
        trainer = dpo_trainer_class()(args=config, stored_ref_log_probs=self.ref_log_probs, **common)
        if self.hp.precompute_ref_log_probs:  # kept with every checkpoint, reused on resume
            fingerprint = self.cfg.data_fingerprint()
            trainer.extra_checkpoint_files = (
                lambda path: write_ref_log_probs(path, fingerprint, trainer.ref_log_probs))
        return trainer

    def _orpo_trainer(self, args: dict[str, Any], common: dict[str, Any]):
        from trl.experimental.orpo import ORPOConfig

        config = ORPOConfig(**args, beta=self.hp.beta, max_length=self.hp.max_seq_len)
        return orpo_trainer_class()(args=config, **common)

    def _validate(self, model) -> dict[str, float]:
        return preference_loss(self.trainer, model)

    def _checkpoint_state(self, state, kind: str) -> dict[str, Any]:
        return checkpoint_state(state, kind=kind, method=self.cfg.method, hp=self.hp,
                                examples_per_epoch=len(self.train_pairs), train_file=self.cfg.train_file.name)

    # ------------------------------------------------------------------ train

    def train(self, resume_from: Path | None) -> bool:
        """Run (or resume) training; True when stopped by SIGTERM."""
        self.train_output = self.trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        return self.run.emergency_checkpoint is not None

    def train_loss(self) -> float | None:
        return mean_train_loss(self.trainer, self.train_output)

    def validation_metrics(self) -> dict[str, Any]:
        return self._validate(self.trainer.model) if self.validation_pairs else {}

    def outcome_metrics(self) -> dict[str, Any]:
        """What this method adds to the `completed` event."""
        return {"ref_log_probs_s": round(getattr(self.trainer, "ref_log_probs_seconds", 0.0), 3)}

    # ------------------------------------------------------------------ save_checkpoint

    def save_checkpoint(self) -> Path:
        """output_dir/final: the adapter, tokenizer, optionally merged, summary, loss curve."""
        cfg = self.cfg
        merge = merged_writer(cfg.base_model, self.tokenizer) if self.hp.merge_adapter else None
        summary = training_summary(
            job_id=cfg.job_id, base_model=cfg.base_model, method=cfg.method, hp=self.hp,
            base_parameters=self.base.parameters, quantization=self.base.quantization, trainer=self.trainer,
            train_loss=self.train_loss(), non_padding_fraction=None)  # trl pads pairs: not measured
        final = write_final_artifact(self.trainer, self.tokenizer, cfg.output_dir, summary=summary,
                                     progress=self.run.progress, title=f"{cfg.job_id} ({cfg.method})", merge=merge)
        self.events.emit("checkpoint", kind="final", step=self.trainer.state.global_step, path=str(final))
        return final

    # ------------------------------------------------------------------ cleanup

    def cleanup(self) -> None:
        remove_partial_artifact(self.cfg.output_dir)
        self.trainer = None
