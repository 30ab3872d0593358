"""Preference-tuning recipe, read top to bottom: setup -> train -> save_checkpoint -> cleanup.

    dpo    trl DPOTrainer on a LoRA adapter (reference = the adapter disabled); the reference
           log-probs are computed once, kept with every checkpoint and reused on resume
    orpo   trl.experimental.orpo ORPOTrainer on a LoRA adapter (no reference model)

Data: {"prompt", "chosen", "rejected"} pairs, tokenized by trl. Components as for SFT:
`session` (the steps every recipe shares), `modeling`, `trainers`, `validation`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from whetstone.contracts.enums import Method

from ..domain.recipe_io import Outcome, Validation
from .faults import Faults
from .hyperparams import Hyperparameters
from .modeling import lora_config
from .protocol import EventStream, PreemptionFlag
from .rows import PreferenceRecord
from .session import TrainingSession
from .spec import RecipeConfig
from .trainers import (
    RefLogProbs,
    SharedTrainingArguments,
    dpo_trainer_class,
    orpo_trainer_class,
    read_ref_log_probs,
    training_arguments,
    write_ref_log_probs,
)
from .validation import preference_loss

METHODS = ("dpo", "orpo")



class TrainerInputs(TypedDict):
    """What trl's DPO and ORPO trainers take besides their config (the library's own objects)."""

    model: Any
    train_dataset: Any
    eval_dataset: Any
    processing_class: Any
    peft_config: Any
    callbacks: list[Any]

class PreferenceRecipe:
    """setup -> train -> save_checkpoint -> cleanup, for dpo / orpo."""

    def __init__(self, cfg: RecipeConfig, events: EventStream, preemption: PreemptionFlag,
                 faults: Faults | None = None) -> None:
        self.session = TrainingSession(cfg, events, preemption, faults, packing=False)
        self.train_pairs: list[PreferenceRecord] = []
        self.validation_pairs: list[PreferenceRecord] = []
        self.ref_log_probs: RefLogProbs | None = None  # DPO: stored with the checkpoint we resume from

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        """Cheap checks first (user errors fail fast), then tokenizer, data, model, trainer."""
        session, cfg = self.session, self.session.cfg
        train_rows, validation_rows = session.read_inputs()
        self.train_pairs = [pair.record() for _, pair in train_rows]
        self.validation_pairs = [pair.record() for _, pair in validation_rows or []]
        if cfg.method == Method.DPO:
            self.ref_log_probs = read_ref_log_probs(cfg.resume_from, cfg.data_fingerprint())
        self._build_trainer(session.load_model([]))

    def rebuild(self, hp: Hyperparameters) -> None:
        """A fresh model and trainer with other batch geometry (after an out-of-memory error)."""
        self.ref_log_probs = getattr(self.session.trainer, "ref_log_probs", None) or self.ref_log_probs
        self._build_trainer(self.session.reload_model(hp))

    def _build_trainer(self, model) -> None:
        from datasets import Dataset
        from transformers import set_seed

        session, cfg, hp = self.session, self.session.cfg, self.session.hp
        set_seed(hp.seed)  # LoRA init
        common = TrainerInputs(
            model=model, train_dataset=Dataset.from_list(self.train_pairs),
            eval_dataset=Dataset.from_list(self.validation_pairs) if self.validation_pairs else None,
            processing_class=session.tokenizer, peft_config=lora_config(model, hp),
            callbacks=session.callbacks(self._validate if self.validation_pairs else None,
                                        examples_per_epoch=len(self.train_pairs)),
        )
        args = training_arguments(hp, output_dir=cfg.output_dir, deepspeed=cfg.deepspeed)
        session.install(self._dpo_trainer(args, common) if cfg.method == Method.DPO else self._orpo_trainer(args, common))

    def _dpo_trainer(self, args: SharedTrainingArguments, common: TrainerInputs):
        from trl import DPOConfig

        hp = self.session.hp
        config = DPOConfig(**args, beta=hp.beta, max_length=hp.max_seq_len,
                           precompute_ref_log_probs=hp.precompute_ref_log_probs)
        trainer = dpo_trainer_class()(args=config, stored_ref_log_probs=self.ref_log_probs, **common)
        if hp.precompute_ref_log_probs:  # kept with every checkpoint, reused on resume
            fingerprint = self.session.cfg.data_fingerprint()
            trainer.extra_checkpoint_files = (
                lambda path: write_ref_log_probs(path, fingerprint, trainer.ref_log_probs))
        return trainer

    def _orpo_trainer(self, args: SharedTrainingArguments, common: TrainerInputs):
        from trl.experimental.orpo import ORPOConfig

        hp = self.session.hp
        return orpo_trainer_class()(args=ORPOConfig(**args, beta=hp.beta, max_length=hp.max_seq_len), **common)

    def _validate(self, model: Any) -> Validation:
        return preference_loss(self.session.trainer, model)

    # ------------------------------------------------------------------ train (session.train)

    def validation(self) -> Validation | None:
        return self._validate(self.session.trainer.model) if self.validation_pairs else None

    def outcome(self) -> Outcome:
        """What this method adds to the `completed` event."""
        return Outcome(ref_log_probs_s=round(getattr(self.session.trainer, "ref_log_probs_seconds", 0.0), 3))

    # ------------------------------------------------------------------ save_checkpoint

    def save_checkpoint(self) -> Path:
        """output_dir/final: the adapter, tokenizer, optionally merged, summary, loss curve."""
        session = self.session  # trl pads pairs: the non-padding fraction is not measured
        return session.save_final(merge=session.hp.merge_adapter, non_padding_fraction=None)

    # ------------------------------------------------------------------ cleanup (session.cleanup)
