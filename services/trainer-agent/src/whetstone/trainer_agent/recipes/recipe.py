"""One training recipe for every method, read top to bottom: setup -> train -> save_checkpoint -> cleanup.

    lora, qlora, full   chat SFT on assistant tokens (transformers Trainer, our collators)
    cpt                 continued pre-training on raw text, every token trained
    dpo                 trl DPOTrainer on a LoRA adapter (reference = adapter disabled),
                        reference log-probs optionally precomputed once and kept with checkpoints
    orpo                trl.experimental.orpo ORPOTrainer on a LoRA adapter

Checkpoints are regular HF Trainer `checkpoint-N` directories (adapter or weights,
optimizer, scheduler, RNG states, trainer state) plus `whetstone_state.json` (data position,
batch geometry, kind). They are written every `checkpoint_every_steps` steps or
`checkpoint_every_minutes` minutes, whichever comes first, and on SIGTERM (emergency).
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import shutil
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from . import attention
from .callbacks import Cadence, DivergenceGuard, RunState, platform_callback
from .data import (
    PaddedCollator, PaddingFreeCollator, TokenCounter, read_rows, tokenize_chat_rows, tokenize_text_rows,
)
from .errors import PlatformError
from .faults import Faults
from .hyperparams import ADAPTER_METHODS, AUTO, PREFERENCE_METHODS, Hyperparameters, plan_auto_batch
from .modeling import (
    check_sequence_length, compute_dtype, count_parameters, load_base_config, load_base_model, lora_config,
    quantization_summary,
)
from .protocol import EventStream, PreemptionFlag
from .spec import RecipeConfig, read_resume_state
from .trainers import (
    dpo_trainer_class, orpo_trainer_class, read_ref_log_probs, sft_trainer_class, write_ref_log_probs,
)

log = logging.getLogger("whetstone.trainer_agent.recipes")

CPU_MICRO_BATCH_TOKENS = 4096
GPU_MICRO_BATCH_TOKENS = 16384


class TrainingRecipe:
    """setup -> train -> save_checkpoint -> cleanup."""

    def __init__(self, cfg: RecipeConfig, events: EventStream, preemption: PreemptionFlag,
                 faults: Faults | None = None) -> None:
        self.cfg = cfg
        self.method = cfg.method
        self.hp: Hyperparameters = cfg.hyperparameters
        self.events = events
        self.preemption = preemption
        self.faults = faults or Faults()
        self.run = RunState()
        self.counter = TokenCounter()
        self.tokenizer = None
        self.trainer = None
        self.train_rows: list = []
        self.validation_rows: list | None = None
        self.examples: list[dict[str, Any]] = []
        self.validation_examples: list[dict[str, Any]] | None = None
        self.resume_state: dict[str, Any] | None = None
        self.ref_log_probs: dict[str, Any] | None = None
        self.train_output = None
        self.n_params = 0
        self.quantization: dict[str, Any] | None = None
        self._zero_init = None

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        """Cheap checks first (user errors fail fast), then tokenizer, data, model, trainer."""
        self.resume_state = read_resume_state(self.cfg.resume_from)
        self.train_rows = read_rows(self.cfg.train_file, self.method)
        if self.cfg.validation_file:
            self.validation_rows = read_rows(self.cfg.validation_file, self.method)
        self.tokenizer = self._load_tokenizer()
        check_sequence_length(self._base_config(), self.hp.max_seq_len)
        if self.method not in PREFERENCE_METHODS:
            self.examples = [e.as_row() for e in self._tokenize(self.train_rows, self.cfg.train_file.name)]
            if self.validation_rows is not None:
                self.validation_examples = [
                    e.as_row() for e in self._tokenize(self.validation_rows, self.cfg.validation_file.name)]
        if self.method == "dpo":
            self.ref_log_probs = read_ref_log_probs(self.cfg.resume_from, self.cfg.data_fingerprint())
        self._zero_init = self._deepspeed_zero_init()
        model = self._load_model()
        self.n_params = count_parameters(model)
        self.quantization = quantization_summary(model)
        self.hp = self._plan_batch(self.hp.resolved(self.method, self.n_params))
        self.trainer = self._build_trainer(model)

    def rebuild(self, hp: Hyperparameters) -> None:
        """A fresh model and trainer with other batch geometry (after an out-of-memory error)."""
        if self.trainer is not None:
            self.run.checkpoint_seconds += getattr(self.trainer, "checkpoint_seconds", 0.0)
            self.ref_log_probs = getattr(self.trainer, "ref_log_probs", None) or self.ref_log_probs
        self.trainer = None
        gc.collect()
        _empty_device_cache()
        self.hp = hp
        self.trainer = self._build_trainer(self._load_model())

    def _load_tokenizer(self):
        from whetstone.modelkit.loading import ModelNotFoundError, load_tokenizer

        try:
            return load_tokenizer(self.cfg.base_model)
        except ModelNotFoundError as exc:
            raise PlatformError(f"base model: {exc}", code="base_model_missing") from exc

    def _base_config(self):
        from whetstone.modelkit.loading import ModelNotFoundError

        try:
            return load_base_config(self.cfg.base_model)
        except ModelNotFoundError as exc:
            raise PlatformError(f"base model: {exc}", code="base_model_missing") from exc

    def _tokenize(self, rows, name: str):
        if self.method == "cpt":
            return tokenize_text_rows(self.tokenizer, rows, self.hp.max_seq_len, name)
        return tokenize_chat_rows(self.tokenizer, rows, self.hp.max_seq_len, name)

    @property
    def packing(self) -> bool:
        return self.hp.packing and self.method not in PREFERENCE_METHODS

    def _load_model(self):
        from whetstone.modelkit.loading import ModelNotFoundError

        impl = attention.register() if self.packing else "sdpa"
        try:
            return load_base_model(self.cfg.base_model, self.method, impl)
        except ModelNotFoundError as exc:
            raise PlatformError(f"base model: {exc}", code="base_model_missing") from exc

    def _deepspeed_zero_init(self):
        """With ZeRO-3 and zero_init, from_pretrained must see the DeepSpeed config BEFORE loading, so that
        each rank materialises only its shard (the object has to stay alive while models are loaded)."""
        stage = (self.cfg.deepspeed or {}).get("zero_optimization", {}).get("stage")
        if not (self.cfg.zero_init and stage == 3):
            return None
        from transformers.integrations import HfDeepSpeedConfig

        return HfDeepSpeedConfig(self.cfg.deepspeed)

    def _plan_batch(self, hp: Hyperparameters) -> Hyperparameters:
        if hp.batch_size == AUTO:
            import torch

            budget = hp.micro_batch_tokens or (GPU_MICRO_BATCH_TOKENS if torch.cuda.is_available()
                                               else CPU_MICRO_BATCH_TOKENS)
            lengths = [len(e["input_ids"]) for e in self.examples] or [hp.max_seq_len]
            hp = hp.with_batch(*plan_auto_batch(hp.target_effective_batch, lengths, budget))
            log.info("batch_size auto: micro-batch %d x accumulation %d", hp.batch_size,
                     hp.gradient_accumulation_steps)
        previous = _checkpoint_geometry(self.cfg.resume_from)
        if previous and previous["micro_batch_size"] * previous["gradient_accumulation_steps"] == hp.effective_batch:
            # the segment before us may have halved its micro-batch after running out of memory
            hp = hp.with_batch(previous["micro_batch_size"], previous["gradient_accumulation_steps"])
        return hp

    def _build_trainer(self, model):
        from transformers import PrinterCallback, set_seed

        set_seed(self.hp.seed)  # LoRA init
        callback = platform_callback(
            self.events, self.preemption, self.run,
            Cadence(self.hp.checkpoint_every_steps, self.hp.checkpoint_every_minutes),
            DivergenceGuard(self.hp.divergence_factor, self.hp.divergence_patience),
            self.hp.learning_rate, self._validator(), self._describe_position)
        if self.method in PREFERENCE_METHODS:
            trainer = self._preference_trainer(model, callback)
        else:
            trainer = self._sft_trainer(model, callback)
        trainer.remove_callback(PrinterCallback)  # our events replace its dict prints
        self.faults.install(trainer.model)
        return trainer

    def _training_arguments(self) -> dict[str, Any]:
        import torch

        use_cuda = torch.cuda.is_available()
        args: dict[str, Any] = dict(
            output_dir=str(self.cfg.output_dir),
            num_train_epochs=self.hp.n_epochs,
            learning_rate=self.hp.learning_rate,
            per_device_train_batch_size=int(self.hp.batch_size),
            per_device_eval_batch_size=int(self.hp.batch_size),
            gradient_accumulation_steps=self.hp.gradient_accumulation_steps,
            lr_scheduler_type="cosine",
            warmup_steps=self.hp.warmup_ratio,  # a float in [0, 1) is a ratio of total steps
            weight_decay=self.hp.weight_decay,
            max_grad_norm=self.hp.max_grad_norm,
            seed=self.hp.seed,
            data_seed=self.hp.seed,
            logging_strategy="steps",
            logging_steps=1,
            logging_nan_inf_filter=False,  # a NaN loss must be seen, not averaged away
            save_strategy="no",  # the platform callback decides when to checkpoint
            report_to="none",
            disable_tqdm=True,
            include_num_input_tokens_seen="non_padding",
            use_cpu=not use_cuda,
            bf16=compute_dtype() == torch.bfloat16,
            dataloader_num_workers=0,
        )
        if self.hp.gradient_checkpointing:
            args["gradient_checkpointing"] = True
        if self.cfg.deepspeed:
            args["deepspeed"] = self.cfg.deepspeed
        return args

    def _sft_trainer(self, model, callback):
        from datasets import Dataset
        from peft import get_peft_model
        from transformers import TrainingArguments

        if self.method in ADAPTER_METHODS:
            model = get_peft_model(model, lora_config(model, self.hp))
        poison = self.faults.poison(model.get_input_embeddings().num_embeddings)
        collator = (PaddingFreeCollator(self.counter, poison) if self.packing
                    else PaddedCollator(self.tokenizer.pad_token_id, self.counter, poison))
        trainer = sft_trainer_class()(
            model=model,
            args=TrainingArguments(**self._training_arguments(), remove_unused_columns=False),
            train_dataset=Dataset.from_list(self.examples),
            data_collator=collator,
            processing_class=self.tokenizer,
            callbacks=[callback],
        )
        trainer.examples_by_line = _by_line(self.examples)
        trainer.data_name = self.cfg.train_file.name
        return trainer

    def _preference_trainer(self, model, callback):
        from datasets import Dataset

        train = Dataset.from_list([pair for _, pair in self.train_rows])
        validation = Dataset.from_list([pair for _, pair in self.validation_rows]) if self.validation_rows else None
        common = dict(model=model, train_dataset=train, eval_dataset=validation, processing_class=self.tokenizer,
                      peft_config=lora_config(model, self.hp), callbacks=[callback])
        if self.method == "dpo":
            from trl import DPOConfig

            args = DPOConfig(**self._training_arguments(), beta=self.hp.beta, max_length=self.hp.max_seq_len,
                             precompute_ref_log_probs=self.hp.precompute_ref_log_probs)
            trainer = dpo_trainer_class()(args=args, stored_ref_log_probs=self.ref_log_probs, **common)
            if self.hp.precompute_ref_log_probs:
                fingerprint = self.cfg.data_fingerprint()
                trainer.extra_checkpoint_files = (
                    lambda path: write_ref_log_probs(path, fingerprint, trainer.ref_log_probs))
            return trainer
        from trl.experimental.orpo import ORPOConfig

        args = ORPOConfig(**self._training_arguments(), beta=self.hp.beta, max_length=self.hp.max_seq_len)
        return orpo_trainer_class()(args=args, **common)

    # ------------------------------------------------------------------ train

    def train(self, resume_from: Path | None) -> bool:
        """Run (or resume) training; True when stopped by SIGTERM."""
        self.train_output = self.trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        return self.run.emergency_checkpoint is not None

    # ------------------------------------------------------------------ save_checkpoint

    def save_checkpoint(self) -> Path:
        """Write output_dir/final atomically: adapter (or weights) + tokenizer + chat template,
        optionally a merged model, the training summary and the loss curve."""
        final = self.cfg.output_dir / "final"
        staging = self.cfg.output_dir / "final.partial"
        shutil.rmtree(staging, ignore_errors=True)
        self.trainer.model.config.use_cache = True  # the artifact is for inference
        self.trainer.save_model(str(staging))
        self.tokenizer.save_pretrained(str(staging))  # tokenizer.json + chat_template.jinja, whatever the trainer did
        (staging / "training_args.bin").unlink(missing_ok=True)  # a pickle: keep it out of the artifact
        if self.hp.merge_adapter and self.method in ADAPTER_METHODS:
            self._save_merged(staging, staging / "merged")
        (staging / "whetstone_training.json").write_text(json.dumps(self._summary(), indent=2) + "\n")
        self._save_loss_curve(staging / "loss_curve.png")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
        self.events.emit("checkpoint", kind="final", step=self.trainer.state.global_step, path=str(final))
        return final

    def _save_merged(self, adapter_dir: Path, out: Path) -> None:
        """merge_and_unload onto a full-precision copy of the base (also for QLoRA adapters)."""
        from peft import PeftModel

        from whetstone.modelkit.loading import load_model

        base = load_model(self.cfg.base_model, dtype=compute_dtype())
        merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
        merged.save_pretrained(str(out))
        self.tokenizer.save_pretrained(str(out))

    def _save_loss_curve(self, path: Path) -> None:
        from .metrics import render_loss_curve

        try:
            render_loss_curve(self.run.progress, path, title=f"{self.cfg.job_id} ({self.method})")
        except (RuntimeError, ValueError) as exc:
            log.warning("no loss curve: %s", exc)

    def _summary(self) -> dict[str, Any]:
        hp = asdict(self.hp)
        hp.pop("explicit", None)
        return {
            "job_id": self.cfg.job_id,
            "base_model": self.cfg.base_model,
            "method": self.method,
            "hyperparameters": hp,
            "base_model_parameters": self.n_params,
            "quantization": self.quantization,
            "global_step": self.trainer.state.global_step,
            "train_loss": self.train_loss(),
            "tokens": self.trainer.state.num_input_tokens_seen,
            "non_padding_fraction": round(self.counter.non_padding_fraction, 6),
        }

    def train_loss(self) -> float | None:
        """Mean logged loss over ALL steps, including those of earlier (preempted) segments."""
        losses = [entry["loss"] for entry in self.trainer.state.log_history if "loss" in entry]
        if losses:
            return sum(losses) / len(losses)
        return self.train_output.training_loss if self.train_output else None

    def validation_metrics(self) -> dict[str, Any]:
        validate = self._validator()
        return validate(self.trainer.model) if validate else {}

    def _validator(self):
        """model -> {"validation_loss", ...}, or None without validation data."""
        if not self.validation_rows:
            return None
        if self.method in PREFERENCE_METHODS:
            return self._preference_validation
        from whetstone.modelkit.holdout import examples_loss, holdout_loss

        if self.method == "cpt":
            pad = self.tokenizer.pad_token_id or 0

            def validate(model):
                metrics = examples_loss(model, self.validation_examples, pad_id=pad, batch_size=int(self.hp.batch_size))
                return {"validation_loss": metrics["loss"], "validation_tokens": metrics["tokens"]}
        else:
            rows = [messages for _, messages in self.validation_rows]

            def validate(model):
                metrics = holdout_loss(model, self.tokenizer, rows, max_len=self.hp.max_seq_len,
                                       batch_size=int(self.hp.batch_size))
                return {"validation_loss": metrics["loss"], "validation_tokens": metrics["tokens"]}
        return validate

    def _preference_validation(self, model) -> dict[str, float]:
        """DPO/ORPO loss on the validation pairs, without logging (trainer.evaluate would log and
        flip the model to eval mode under the step's own log)."""
        was_training = model.training
        try:
            output = self.trainer.evaluation_loop(self.trainer.get_eval_dataloader(), "validation",
                                                  prediction_loss_only=True)
        finally:
            model.train(was_training)
            getattr(self.trainer, "_metrics", {}).get("eval", {}).clear()
        return {"validation_loss": output.metrics["eval_loss"]}

    def _describe_position(self, state) -> dict[str, Any]:
        """whetstone_state.json: where in the data this checkpoint stands, with which batch geometry."""
        n = len(self.examples) if self.examples else len(self.train_rows)
        micro, accumulation = int(self.hp.batch_size), self.hp.gradient_accumulation_steps
        steps_per_epoch = math.ceil(math.ceil(n / micro) / accumulation)
        in_epoch = state.global_step % steps_per_epoch
        return {
            "step": state.global_step,
            "epoch": state.epoch,
            "method": self.method,
            "micro_batch_size": micro,
            "gradient_accumulation_steps": accumulation,
            "effective_batch": micro * accumulation,
            "data_position": {
                "epoch_index": state.global_step // steps_per_epoch,
                "optimizer_steps_into_epoch": in_epoch,
                "micro_batches_into_epoch": in_epoch * accumulation,
                "examples_into_epoch": min(n, in_epoch * accumulation * micro),
                "examples_per_epoch": n,
                "shuffle_seed": self.hp.seed,
            },
            "tokens_seen": state.num_input_tokens_seen,
            "train_file": self.cfg.train_file.name,
        }

    # ------------------------------------------------------------------ cleanup

    def cleanup(self) -> None:
        shutil.rmtree(self.cfg.output_dir / "final.partial", ignore_errors=True)
        self.trainer = None


def halved_batch(hp: Hyperparameters) -> Hyperparameters | None:
    """Half the micro-batch, twice the accumulation: the same effective batch. None at 1.

    An odd micro-batch cannot be halved exactly; it drops to 1 with all of it accumulated."""
    micro, accumulation = int(hp.batch_size), hp.gradient_accumulation_steps
    if micro < 2:
        return None
    if micro % 2:
        return replace(hp, batch_size=1, gradient_accumulation_steps=accumulation * micro)
    return replace(hp, batch_size=micro // 2, gradient_accumulation_steps=accumulation * 2)


def _by_line(examples: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for row in examples:
        out.setdefault(row["line"], []).append(row)
    return out


def _checkpoint_geometry(resume: Path | None) -> dict[str, Any] | None:
    path = resume / "whetstone_state.json" if resume else None
    if path is None or not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
        return {k: int(state[k]) for k in ("micro_batch_size", "gradient_accumulation_steps")}
    except (ValueError, KeyError, TypeError):
        return None


def _empty_device_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()

