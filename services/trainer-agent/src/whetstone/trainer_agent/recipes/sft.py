"""Supervised fine-tuning recipe, read top to bottom: setup -> train -> save_checkpoint -> cleanup.

    lora, qlora, full   chat SFT on the assistant tokens (the platform's mask, per-message weights)
    cpt                 continued pre-training on raw text, every token trained

HF Trainer with the platform's collators: padding-free packing (one row per micro-batch,
per-example attention) or padded batches. Components: `data` (rows, tokenization, collators),
`modeling` (base model, LoRA), `trainers` (arguments, timed saves, bad-example blame),
`callbacks` (progress, cadence, SIGTERM, divergence), `checkpointing` (whetstone_state.json,
the final artifact), `validation`.

Checkpoints are HF Trainer `checkpoint-N` directories plus `whetstone_state.json`, written every
`checkpoint_every_steps` steps or `checkpoint_every_minutes` minutes, whichever comes first, and
on SIGTERM (emergency). Started by `main.py`, which owns the OOM retries and the final events.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .callbacks import RunState, TrainingMonitor, platform_callback
from .checkpointing import (
    checkpoint_geometry, checkpoint_state, mean_train_loss, merged_writer, remove_partial_artifact, training_summary,
    write_final_artifact,
)
from .data import (
    PaddedCollator, PaddingFreeCollator, TokenCounter, examples_by_line, read_rows, tokenize_chat_rows,
    tokenize_text_rows,
)
from .faults import Faults
from .hyperparams import ADAPTER_METHODS, Hyperparameters, plan_batch
from .modeling import (
    BaseModelFacts, check_sequence_length, deepspeed_zero_init, describe_base, load_base_config, load_base_model,
    load_base_tokenizer, lora_config, micro_batch_token_budget,
)
from .protocol import EventStream, PreemptionFlag
from .spec import RecipeConfig, read_resume_state
from .trainers import finish_trainer, free_memory, sft_trainer_class, training_arguments
from .validation import Validator, examples_validator

METHODS = ("lora", "qlora", "full", "cpt")


class SFTRecipe:
    """setup -> train -> save_checkpoint -> cleanup, for lora / qlora / full / cpt."""

    def __init__(self, cfg: RecipeConfig, events: EventStream, preemption: PreemptionFlag,
                 faults: Faults | None = None) -> None:
        self.cfg = cfg
        self.hp: Hyperparameters = cfg.hyperparameters
        self.events = events
        self.preemption = preemption
        self.faults = faults or Faults()
        self.run = RunState()          # what outlives one Trainer (an OOM retry builds a new one)
        self.counter = TokenCounter()  # real vs computed tokens, over the whole segment
        self.tokenizer = None
        self.trainer = None
        self.train_output = None
        self.examples: list[dict[str, Any]] = []
        self.validation_rows: list | None = None
        self.validation_examples: list[dict[str, Any]] | None = None
        self.base: BaseModelFacts | None = None
        self._zero_init = None

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        """Cheap checks first (user errors fail fast), then tokenizer, data, model, trainer."""
        cfg = self.cfg
        read_resume_state(cfg.resume_from)
        train_rows = read_rows(cfg.train_file, cfg.method)
        if cfg.validation_file:
            self.validation_rows = read_rows(cfg.validation_file, cfg.method)
        self.tokenizer = load_base_tokenizer(cfg.base_model)
        check_sequence_length(load_base_config(cfg.base_model), self.hp.max_seq_len)
        self.examples = self._tokenize(train_rows, cfg.train_file.name)
        if self.validation_rows is not None:
            self.validation_examples = self._tokenize(self.validation_rows, cfg.validation_file.name)
        self._zero_init = deepspeed_zero_init(cfg.deepspeed, cfg.zero_init)  # alive while models load
        model = load_base_model(cfg.base_model, cfg.method, packing=self.hp.packing)
        self.base = describe_base(model)
        self.hp = plan_batch(self.hp.resolved(cfg.method, self.base.parameters),
                             [len(e["input_ids"]) for e in self.examples], micro_batch_token_budget(self.hp),
                             checkpoint_geometry(cfg.resume_from))
        self.trainer = self._build_trainer(model)

    def rebuild(self, hp: Hyperparameters) -> None:
        """A fresh model and trainer with other batch geometry (after an out-of-memory error)."""
        self.run.checkpoint_seconds += getattr(self.trainer, "checkpoint_seconds", 0.0)
        self.trainer = None
        free_memory()
        self.hp = hp
        self.trainer = self._build_trainer(load_base_model(self.cfg.base_model, self.cfg.method,
                                                           packing=self.hp.packing))

    def _tokenize(self, rows, name: str) -> list[dict[str, Any]]:
        tokenize = tokenize_text_rows if self.cfg.method == "cpt" else tokenize_chat_rows
        return [e.as_row() for e in tokenize(self.tokenizer, rows, self.hp.max_seq_len, name)]

    def _build_trainer(self, model):
        from datasets import Dataset
        from peft import get_peft_model
        from transformers import TrainingArguments, set_seed

        set_seed(self.hp.seed)  # LoRA init
        if self.cfg.method in ADAPTER_METHODS:
            model = get_peft_model(model, lora_config(model, self.hp))
        poison = self.faults.poison(model.get_input_embeddings().num_embeddings)
        collator = (PaddingFreeCollator(self.counter, poison) if self.hp.packing
                    else PaddedCollator(self.tokenizer.pad_token_id, self.counter, poison))
        monitor = TrainingMonitor(self.events, self.preemption, self.run, self.hp, self._validator(),
                                  self._checkpoint_state)
        trainer = sft_trainer_class()(
            model=model,
            args=TrainingArguments(**training_arguments(self.hp, output_dir=self.cfg.output_dir,
                                                        deepspeed=self.cfg.deepspeed), remove_unused_columns=False),
            train_dataset=Dataset.from_list(self.examples),
            data_collator=collator,
            processing_class=self.tokenizer,
            callbacks=[platform_callback(monitor)],
        )
        trainer.examples_by_line = examples_by_line(self.examples)
        trainer.data_name = self.cfg.train_file.name
        return finish_trainer(trainer, self.faults)

    def _validator(self) -> Validator | None:
        if not self.validation_rows:
            return None
        # the held-out rows as tokenized for training (chat: the platform's mask, tools rendered)
        return examples_validator(self.validation_examples or [], pad_id=self.tokenizer.pad_token_id or 0,
                                  batch_size=int(self.hp.batch_size))

    def _checkpoint_state(self, state, kind: str) -> dict[str, Any]:
        return checkpoint_state(state, kind=kind, method=self.cfg.method, hp=self.hp,
                                examples_per_epoch=len(self.examples), train_file=self.cfg.train_file.name)

    # ------------------------------------------------------------------ train

    def train(self, resume_from: Path | None) -> bool:
        """Run (or resume) training; True when stopped by SIGTERM."""
        self.train_output = self.trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        return self.run.emergency_checkpoint is not None

    def train_loss(self) -> float | None:
        return mean_train_loss(self.trainer, self.train_output)

    def validation_metrics(self) -> dict[str, Any]:
        validate = self._validator()
        return validate(self.trainer.model) if validate else {}

    def outcome_metrics(self) -> dict[str, Any]:
        """What this method adds to the `completed` event."""
        return {"non_padding_fraction": round(self.counter.non_padding_fraction, 6) if self.counter.computed else None}

    # ------------------------------------------------------------------ save_checkpoint

    def save_checkpoint(self) -> Path:
        """output_dir/final: adapter (or weights), tokenizer, optionally merged, summary, loss curve."""
        cfg = self.cfg
        merge = merged_writer(cfg.base_model, self.tokenizer) \
            if self.hp.merge_adapter and cfg.method in ADAPTER_METHODS else None
        summary = training_summary(
            job_id=cfg.job_id, base_model=cfg.base_model, method=cfg.method, hp=self.hp,
            base_parameters=self.base.parameters, quantization=self.base.quantization, trainer=self.trainer,
            train_loss=self.train_loss(), non_padding_fraction=self.counter.non_padding_fraction)
        final = write_final_artifact(self.trainer, self.tokenizer, cfg.output_dir, summary=summary,
                                     progress=self.run.progress, title=f"{cfg.job_id} ({cfg.method})", merge=merge)
        self.events.emit("checkpoint", kind="final", step=self.trainer.state.global_step, path=str(final))
        return final

    # ------------------------------------------------------------------ cleanup

    def cleanup(self) -> None:
        remove_partial_artifact(self.cfg.output_dir)
        self.trainer = None
