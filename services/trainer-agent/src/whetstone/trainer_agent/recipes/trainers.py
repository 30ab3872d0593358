"""Trainer components: the arguments every recipe shares, and the trainer classes - HF Trainer
(SFT, CPT) and trl's DPO/ORPO - with the platform's additions.

- `TimedSaveMixin`: measures checkpoint writing (the checkpoint overhead figure) and adds
  files the platform keeps with every checkpoint (DPO reference log-probs).
- `BadExampleMixin` (SFT/CPT): a forward that fails on a micro-batch (not out of memory)
  is re-run example by example to name the source line at fault.
- `StoredRefDPOTrainer`: DPO whose reference log-probs, computed once, are kept with the
  checkpoints and reused on resume instead of being recomputed.
- `GangOrderMixin` (SFT/CPT across ranks): the data order of `gang_order`, so a gang's every step
  equals the one-process step with its effective batch.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from ..domain.launch import COLLECTIVE_TIMEOUT_ENV
from .errors import PlatformError, UserError, is_out_of_memory
from .gang_check import join_cpu_process_group
from .gang_order import GangOrder, blank_example, blanks_needed

if TYPE_CHECKING:
    from ..domain.deepspeed_json import DeepSpeedConfig
    from .session import TrainingSession
    from .validation import Validator

log = logging.getLogger("whetstone.trainer_agent.recipes")

REF_LOG_PROBS_FILE = "ref_log_probs.json"


def collective_timeout_s(default: int = 1800) -> int:
    """The process group's timeout (init_process_group via TrainingArguments.ddp_timeout): how long a
    rank waits in a collective, or for the gang's other nodes to join, before it fails. The agent sets
    it from its collective_timeout_s; transformers' own 1800 s otherwise."""
    raw = os.environ.get(COLLECTIVE_TIMEOUT_ENV, "")
    try:
        return max(int(raw), 1) if raw else default
    except ValueError:
        raise PlatformError(f"{COLLECTIVE_TIMEOUT_ENV} must be a whole number of seconds, got {raw!r}",
                            code="bad_recipe_config") from None


class SharedTrainingArguments(TypedDict):
    """The keyword arguments of TrainingArguments (and of trl's configs, its subclasses) that every method
    shares. The optional ones are left out when unset: trl's configs have defaults of their own
    (DPOConfig turns gradient checkpointing on)."""

    output_dir: str
    num_train_epochs: float
    learning_rate: float
    per_device_train_batch_size: int
    per_device_eval_batch_size: int
    gradient_accumulation_steps: int
    lr_scheduler_type: str
    warmup_steps: float
    weight_decay: float
    max_grad_norm: float
    seed: int
    data_seed: int
    logging_strategy: str
    logging_steps: int
    logging_nan_inf_filter: bool
    save_strategy: str
    report_to: str
    disable_tqdm: bool
    include_num_input_tokens_seen: Literal["non_padding", "no"]
    use_cpu: bool
    bf16: bool
    dataloader_num_workers: int
    ddp_timeout: int
    gradient_checkpointing: NotRequired[bool]
    deepspeed: NotRequired[dict[str, JsonValue]]


def training_arguments(hp, *, output_dir: Path, deepspeed: DeepSpeedConfig | None,
                       count_input_tokens: bool = True) -> SharedTrainingArguments:
    """Keyword arguments of TrainingArguments (or trl's configs) shared by every method. `count_input_tokens`
    off where the inputs have no input_ids for the Trainer to count (GRPO's prompts)."""
    import torch

    from .modeling import compute_dtype

    use_cuda = torch.cuda.is_available()
    timeout_s = collective_timeout_s()
    if not use_cuda:
        join_cpu_process_group(timeout_s)   # transformers passes ddp_timeout to accelerate on GPU only
    args = SharedTrainingArguments(
        output_dir=str(output_dir),
        num_train_epochs=hp.n_epochs,
        learning_rate=hp.learning_rate,
        per_device_train_batch_size=int(hp.batch_size),
        per_device_eval_batch_size=int(hp.batch_size),
        gradient_accumulation_steps=hp.gradient_accumulation_steps,
        lr_scheduler_type="cosine",
        warmup_steps=hp.warmup_ratio,  # a float in [0, 1) is a ratio of total steps
        weight_decay=hp.weight_decay,
        max_grad_norm=hp.max_grad_norm,
        seed=hp.seed,
        data_seed=hp.seed,
        logging_strategy="steps",
        logging_steps=1,
        logging_nan_inf_filter=False,  # a NaN loss must be seen, not averaged away
        save_strategy="no",  # the platform callback decides when to checkpoint
        report_to="none",
        disable_tqdm=True,
        include_num_input_tokens_seen="non_padding" if count_input_tokens else "no",
        use_cpu=not use_cuda,
        bf16=compute_dtype() == torch.bfloat16,
        dataloader_num_workers=0,
        ddp_timeout=timeout_s,
    )
    if hp.gradient_checkpointing:
        args = {**args, "gradient_checkpointing": True}
    if deepspeed is not None:
        args = {**args, "deepspeed": deepspeed.document()}
    return args


def finish_trainer(trainer, faults):
    """Our events replace the PrinterCallback's dict prints; test faults hook the trained model."""
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    faults.install(trainer.model)
    return trainer


def free_memory() -> None:
    """After the last reference to a trainer is dropped (before rebuilding one after out of memory)."""
    import gc

    from .modeling import empty_device_cache

    gc.collect()
    empty_device_cache()


class TimedSaveMixin:
    checkpoint_seconds: float = 0.0
    extra_checkpoint_files: Callable[[Path], None] | None = None

    def _save_checkpoint(self, model, trial):
        started = time.perf_counter()
        super()._save_checkpoint(model, trial)
        if self.extra_checkpoint_files is not None:
            self.extra_checkpoint_files(Path(self.args.output_dir, f"checkpoint-{self.state.global_step}"))
        self.checkpoint_seconds += time.perf_counter() - started


class BadExampleMixin:
    """Needs `examples_by_line` ({line: [rows]}), `data_name` and `data_collator`."""

    examples_by_line: dict[int, list[dict[str, Any]]] = {}
    data_name: str = "training data"

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        lines = inputs.pop("example_lines", None)
        try:
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        except Exception as exc:
            if is_out_of_memory(exc) or lines is None:
                raise
            raise self._blame(model, [int(x) for x in lines.tolist()], exc) from exc

    def _blame(self, model, lines: list[int], exc: Exception) -> Exception:
        import torch

        for line in lines:
            for row in self.examples_by_line.get(line, []):
                batch = self.data_collator([row])
                batch.pop("example_lines", None)
                batch = {k: v.to(self.args.device) for k, v in batch.items()}
                try:
                    with torch.no_grad():
                        model(**batch)
                except Exception as alone:  # noqa: BLE001 - any failure of this example alone
                    return UserError(f"{self.data_name} line {line}: the model failed on this example mid-run "
                                     f"({type(alone).__name__}: {alone})", code="bad_example",
                                     advice=[f"fix or remove line {line} of {self.data_name}"])
        return PlatformError(f"training step failed ({type(exc).__name__}: {exc}); no single example of the "
                             f"micro-batch (lines {lines}) reproduces it", code="training_step_failed")


class GangOrderMixin:
    """`real_examples` > 0 on a gang run whose dataset ends with blank examples (`gang_order`)."""

    real_examples: int = 0

    def _get_train_sampler(self, train_dataset=None):
        if not self.real_examples:
            return super()._get_train_sampler(train_dataset)
        import torch

        seed = self.args.data_seed if self.args.data_seed is not None else torch.random.initial_seed()
        return GangOrder(self.real_examples, len(train_dataset or self.train_dataset), seed)


def sft_trainer_class():
    from transformers import Trainer

    return type("PlatformSFTTrainer", (TimedSaveMixin, BadExampleMixin, GangOrderMixin, Trainer), {})


def _with_blanks(train_dataset, args, pad_id: int):
    """On a gang run, the dataset followed by the blank examples that fill its last global step (the
    number of real examples, or 0 when nothing is appended: one process, or rows of another shape)."""
    per_global_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
    blanks = blanks_needed(len(train_dataset), per_global_step)
    columns = getattr(train_dataset, "column_names", None)   # a datasets.Dataset of tokenized rows
    if args.world_size < 2 or not blanks or columns is None or set(columns) != set(blank_example(pad_id)):
        return train_dataset, 0
    from datasets import Dataset, concatenate_datasets

    filler = Dataset.from_list([blank_example(pad_id)] * blanks, features=train_dataset.features)
    return concatenate_datasets([train_dataset, filler]), len(train_dataset)


def install_sft_trainer(session: TrainingSession, model, *, train_dataset: Sequence, collator, processing_class,
                        validator: Validator | None, examples_by_line: dict[int, list]) -> None:
    """The platform's SFT trainer (`sft_trainer_class`) on `train_dataset` with the session's arguments and
    callbacks, installed in the session; `examples_by_line` lets it name the source line of a failing example."""
    from transformers import TrainingArguments

    cfg, hp = session.cfg, session.hp
    args = TrainingArguments(**training_arguments(hp, output_dir=cfg.output_dir, deepspeed=cfg.deepspeed),
                             remove_unused_columns=False)
    examples_per_epoch = len(train_dataset)
    train_dataset, real_examples = _with_blanks(train_dataset, args, getattr(processing_class, "pad_token_id", None) or 0)
    trainer = sft_trainer_class()(
        model=model,
        args=args,
        train_dataset=train_dataset,
        data_collator=collator,
        processing_class=processing_class,
        callbacks=session.callbacks(validator, examples_per_epoch=examples_per_epoch),
    )
    trainer.real_examples = real_examples
    trainer.examples_by_line = examples_by_line
    trainer.data_name = cfg.train_file.name
    session.install(trainer)


def dpo_trainer_class():
    from trl import DPOTrainer

    class StoredRefDPOTrainer(TimedSaveMixin, DPOTrainer):
        def __init__(self, *args, stored_ref_log_probs: RefLogProbs | None = None, **kwargs) -> None:
            self.ref_log_probs: RefLogProbs = dict(stored_ref_log_probs or {})
            self.ref_log_probs_seconds = 0.0
            super().__init__(*args, **kwargs)

        def _precompute_ref_logps(self, dataset, name, batch_size):
            stored = self.ref_log_probs.get(name)
            if stored and len(stored.chosen) == len(dataset):
                log.info("reusing %d stored reference log-probs for %s", len(dataset), name)
                return dataset.add_column("ref_chosen_logps", stored.chosen).add_column(
                    "ref_rejected_logps", stored.rejected)
            started = time.perf_counter()
            dataset = super()._precompute_ref_logps(dataset, name, batch_size)
            self.ref_log_probs_seconds += time.perf_counter() - started
            self.ref_log_probs[name] = PairLogProbs(chosen=list(dataset["ref_chosen_logps"]),
                                                    rejected=list(dataset["ref_rejected_logps"]))
            return dataset

    return StoredRefDPOTrainer


class PairTokenCountMixin:
    """ORPO batches have no `input_ids`: count the real tokens of prompt, chosen and rejected."""

    def _track_num_input_tokens(self, inputs):
        masks = [v for k, v in inputs.items() if k.endswith("attention_mask")]
        self.state.num_input_tokens_seen += int(sum(int(m.sum()) for m in masks))


def orpo_trainer_class():
    from trl.experimental.orpo import ORPOTrainer

    return type("PlatformORPOTrainer", (TimedSaveMixin, PairTokenCountMixin, ORPOTrainer), {})


class PairLogProbs(BaseModel):
    """The reference model's log-probs of one dataset's chosen and rejected answers, row by row."""

    chosen: list[float]
    rejected: list[float]


RefLogProbs = dict[str, PairLogProbs]   # by the name trl gives the dataset ("train", "eval")


class StoredRefLogProbs(BaseModel):
    """REF_LOG_PROBS_FILE: the log-probs by dataset name beside the `fingerprint` of what they depend on
    (`RecipeConfig.data_fingerprint`)."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, PairLogProbs] = Field(init=False)

    fingerprint: str | None = None


def write_ref_log_probs(path: Path, fingerprint: str, ref_log_probs: RefLogProbs) -> None:
    stored = StoredRefLogProbs(fingerprint=fingerprint, **ref_log_probs)
    (Path(path) / REF_LOG_PROBS_FILE).write_text(json.dumps(stored.model_dump()))


def read_ref_log_probs(directory: Path | None, fingerprint: str) -> RefLogProbs | None:
    if directory is None or not (Path(directory) / REF_LOG_PROBS_FILE).is_file():
        return None
    stored = StoredRefLogProbs.model_validate_json((Path(directory) / REF_LOG_PROBS_FILE).read_text())
    if stored.fingerprint != fingerprint:
        log.warning("stored reference log-probs are for other data or another base model; recomputing")
        return None
    return dict(stored.__pydantic_extra__ or {})
