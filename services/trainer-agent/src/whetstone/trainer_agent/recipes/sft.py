"""Supervised fine-tuning recipe, read top to bottom: setup -> train -> save_checkpoint -> cleanup.

    lora, qlora, full   chat SFT on the assistant tokens (the platform's mask, per-message weights)
    cpt                 continued pre-training on raw text, every token trained

HF Trainer with the platform's collators: padding-free packing (one row per micro-batch,
per-example attention) or padded batches. Components: `session` (the steps every recipe shares:
checks, base model, OOM rebuild, train, final artifact, cleanup), `data` (rows, tokenization,
collators), `modeling` (LoRA), `trainers` (arguments, bad-example blame), `validation`.

Checkpoints are HF Trainer `checkpoint-N` directories plus `whetstone_state.json`, written every
`checkpoint_every_steps` steps or `checkpoint_every_minutes` minutes, whichever comes first, and
on SIGTERM (emergency). Started by `main.py`, which owns the OOM retries and the final events.
"""

from __future__ import annotations

from pathlib import Path

from whetstone.contracts.enums import Method

from ..domain.recipe_io import Outcome, Validation
from .data import (
    Example,
    PaddedCollator,
    PaddingFreeCollator,
    TokenCounter,
    examples_by_line,
    tokenize_chat_rows,
    tokenize_text_rows,
)
from .faults import Faults
from .hyperparams import ADAPTER_METHODS, Hyperparameters
from .modeling import lora_config
from .protocol import EventStream, PreemptionFlag
from .session import TrainingSession
from .spec import RecipeConfig
from .trainers import install_sft_trainer
from .validation import Validator, examples_validator

METHODS = ("lora", "qlora", "full", "cpt")


class SFTRecipe:
    """setup -> train -> save_checkpoint -> cleanup, for lora / qlora / full / cpt."""

    def __init__(self, cfg: RecipeConfig, events: EventStream, preemption: PreemptionFlag,
                 faults: Faults | None = None) -> None:
        self.session = TrainingSession(cfg, events, preemption, faults, packing=cfg.hyperparameters.packing)
        self.counter = TokenCounter()  # real vs computed tokens, over the whole segment
        self.examples: list[Example] = []
        self.validation_examples: list[Example] | None = None

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        """Cheap checks first (user errors fail fast), then tokenizer, data, model, trainer."""
        session, cfg = self.session, self.session.cfg
        train_rows, validation_rows = session.read_inputs()
        self.examples = self._tokenize(train_rows, cfg.train_file.name)
        if validation_rows is not None:
            self.validation_examples = self._tokenize(validation_rows, cfg.validation_file.name)
        model = session.load_model([len(e.input_ids) for e in self.examples])
        self._build_trainer(model)

    def rebuild(self, hp: Hyperparameters) -> None:
        """A fresh model and trainer with other batch geometry (after an out-of-memory error)."""
        self._build_trainer(self.session.reload_model(hp))

    def _tokenize(self, rows, name: str) -> list[Example]:
        session = self.session
        if session.cfg.method == Method.CPT:
            return tokenize_text_rows(session.tokenizer, rows, session.hp.max_seq_len, name)
        return tokenize_chat_rows(session.tokenizer, rows, session.hp.max_seq_len, name)

    def _build_trainer(self, model) -> None:
        from datasets import Dataset
        from peft import get_peft_model
        from transformers import set_seed

        session, cfg, hp = self.session, self.session.cfg, self.session.hp
        set_seed(hp.seed)  # LoRA init
        if cfg.method in ADAPTER_METHODS:
            model = get_peft_model(model, lora_config(model, hp))
        poison = session.faults.poison(model.get_input_embeddings().num_embeddings)
        collator = (PaddingFreeCollator(self.counter, poison) if hp.packing
                    else PaddedCollator(session.tokenizer.pad_token_id, self.counter, poison))
        install_sft_trainer(session, model, train_dataset=Dataset.from_list([e.as_row() for e in self.examples]),
                            collator=collator,
                            processing_class=session.tokenizer, validator=self._validator(),
                            examples_by_line=examples_by_line(self.examples))

    def _validator(self) -> Validator | None:
        if self.validation_examples is None:
            return None
        # the held-out rows as tokenized for training (chat: the platform's mask, tools rendered)
        return examples_validator([e.as_row() for e in self.validation_examples], pad_id=self.session.tokenizer.pad_token_id or 0,
                                  batch_size=int(self.session.hp.batch_size))

    # ------------------------------------------------------------------ train (session.train)

    def validation(self) -> Validation | None:
        validate = self._validator()
        return validate(self.session.trainer.model) if validate else None

    def outcome(self) -> Outcome:
        """What this method adds to the `completed` event."""
        return Outcome(non_padding_fraction=round(self.counter.non_padding_fraction, 6) if self.counter.computed
                       else None)

    # ------------------------------------------------------------------ save_checkpoint

    def save_checkpoint(self) -> Path:
        """output_dir/final: adapter (or weights), tokenizer, optionally merged, summary, loss curve."""
        session = self.session
        return session.save_final(merge=session.hp.merge_adapter and session.cfg.method in ADAPTER_METHODS,
                                  non_padding_fraction=self.counter.non_padding_fraction)

    # ------------------------------------------------------------------ cleanup (session.cleanup)
