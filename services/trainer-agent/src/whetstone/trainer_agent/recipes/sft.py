"""LoRA supervised fine-tuning recipe, run by the trainer agent as a child process.

    python -m whetstone.trainer_agent.recipes.sft --config CONFIG.json

Read it top to bottom: `main` installs the SIGTERM handler, claims stdout for events,
then runs `setup -> train -> save_checkpoint -> cleanup` of `LoRASFTRecipe`.

Protocol with the parent (the trainer agent):
- stdout carries ONLY events, one JSON object per line (`started`, `progress`,
  `checkpoint`, `completed`, `failed`, `preempted`). Everything else (logs, warnings,
  progress bars, stray prints of libraries) goes to stderr: fd 1 is re-pointed to fd 2
  before anything heavy is imported.
- SIGTERM (spot loss, priority preemption): the current optimizer step finishes, an
  emergency checkpoint (a regular, resumable HF Trainer `checkpoint-N`) is written, then
  `checkpoint` + `preempted` events are printed and the process exits 0.
- Exit status: 0 completed or preempted, 1 failed (after a `failed` event).

Loss is computed on assistant tokens only, with the mask computed by the platform
(`whetstone.modelkit.chat.tokenize_chat`), because real chat templates lack trl's
`{% generation %}` markers. trl's `SFTTrainer` takes the pre-tokenized dataset and uses
our `labels` column as is.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TextIO

log = logging.getLogger("whetstone.trainer_agent.recipes.sft")

SUPPORTED_ROLES = ("system", "user", "assistant")


# --------------------------------------------------------------------------- errors


class RecipeError(Exception):
    """A failure reported to the parent as a `failed` event."""

    error_class = "platform"


class UserError(RecipeError):
    """The user's data or hyperparameters are at fault (not retried by the platform)."""

    error_class = "user"


class PlatformError(RecipeError):
    """The platform is at fault (bad config from the agent, missing files, crashes)."""

    error_class = "platform"


# --------------------------------------------------------------------------- events on stdout


class EventStream:
    """One JSON object per line on the ORIGINAL stdout; fd 1 then points at stderr."""

    def __init__(self, stream: TextIO, job_id: str | None = None) -> None:
        self._stream = stream
        self.job_id = job_id

    @classmethod
    def claim_stdout(cls) -> EventStream:
        sys.stdout.flush()
        events_fd = os.dup(1)
        os.dup2(2, 1)  # every later write to fd 1 (print, tqdm, C code) lands on stderr
        return cls(os.fdopen(events_fd, "w", buffering=1, encoding="utf-8"))

    def emit(self, event: str, **fields: Any) -> None:
        payload = {"event": event, **{k: _json_safe(v) for k, v in fields.items()}}
        if self.job_id is not None:
            payload.setdefault("job_id", self.job_id)
        payload["time"] = round(time.time(), 3)
        try:
            self._stream.write(json.dumps(payload, allow_nan=False) + "\n")
            self._stream.flush()
        except BrokenPipeError:  # parent went away; keep training, logs still go to stderr
            log.warning("event stream closed; dropped event %s", event)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):  # 0-d tensors / numpy scalars
        return _json_safe(value.item())
    return value


# --------------------------------------------------------------------------- preemption


class PreemptionFlag:
    """Set by SIGTERM; polled by the trainer callback after each optimizer step."""

    def __init__(self) -> None:
        self.requested = False
        self.received_at: float | None = None

    def install(self) -> PreemptionFlag:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def _on_sigterm(self, signum, frame) -> None:  # noqa: ARG002
        if not self.requested:
            self.requested, self.received_at = True, time.time()
            log.warning("SIGTERM received: stopping after the current optimizer step")


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class Hyperparameters:
    # Defaults are tuned for the demo (tiny random Llama, chat_demo.jsonl, CPU); the
    # scheduler resolves per-base-model hyperparameters for real jobs.
    n_epochs: int = 2
    learning_rate: float = 1e-2
    batch_size: int = 8
    gradient_accumulation_steps: int = 1
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    max_seq_len: int = 256
    seed: int = 0
    checkpoint_every_steps: int = 50  # 0 = only emergency and final checkpoints
    warmup_ratio: float = 0.05

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Hyperparameters:
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            log.warning("ignoring unknown hyperparameters: %s", ", ".join(unknown))
        values: dict[str, Any] = {}
        for name, field in known.items():
            if name not in raw or raw[name] is None:
                continue
            kind = int if field.type in ("int", int) else float
            value = raw[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
                raise UserError(f"hyperparameter {name} must be {kind.__name__}, got {value!r}")
            values[name] = kind(value)
        hp = cls(**values)
        hp.validate()
        return hp

    def validate(self) -> None:
        checks = {
            "n_epochs": self.n_epochs >= 1,
            "learning_rate": 0 < self.learning_rate < 1,
            "batch_size": self.batch_size >= 1,
            "gradient_accumulation_steps": self.gradient_accumulation_steps >= 1,
            "lora_r": self.lora_r >= 1,
            "lora_alpha": self.lora_alpha >= 1,
            "lora_dropout": 0 <= self.lora_dropout < 1,
            "max_seq_len": self.max_seq_len >= 8,
            "checkpoint_every_steps": self.checkpoint_every_steps >= 0,
            "warmup_ratio": 0 <= self.warmup_ratio < 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise UserError("invalid hyperparameters: " + ", ".join(f"{n}={getattr(self, n)!r}" for n in bad))


@dataclass(frozen=True)
class RecipeConfig:
    job_id: str
    base_model: str
    train_file: Path
    output_dir: Path
    hyperparameters: Hyperparameters
    method: str = "lora"
    validation_file: Path | None = None
    resume_from: Path | None = None

    @classmethod
    def load(cls, path: Path) -> RecipeConfig:
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise PlatformError(f"cannot read recipe config {path}: {exc}") from exc
        missing = [k for k in ("job_id", "base_model", "train_file", "output_dir") if not raw.get(k)]
        if missing:
            raise PlatformError(f"recipe config {path} is missing: {', '.join(missing)}")
        if raw.get("method", "lora") != "lora":
            raise UserError(f"unsupported method {raw.get('method')!r} (this recipe trains 'lora')")
        optional = {k: Path(raw[k]).resolve() for k in ("validation_file", "resume_from") if raw.get(k)}
        return cls(
            job_id=str(raw["job_id"]),
            base_model=str(raw["base_model"]),
            train_file=Path(raw["train_file"]).resolve(),
            output_dir=Path(raw["output_dir"]).resolve(),
            hyperparameters=Hyperparameters.parse(raw.get("hyperparameters") or {}),
            **optional,
        )


# --------------------------------------------------------------------------- data


def read_chat_jsonl(path: Path) -> list[tuple[int, list[dict[str, Any]]]]:
    """(line number, messages) per non-blank line; UserError naming the line on bad data."""
    if not path.is_file():
        raise PlatformError(f"data file {path} does not exist")
    rows = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path.name} line {line_no}: invalid JSON ({exc.msg})") from exc
            rows.append((line_no, _validate_row(row, path.name, line_no)))
    if not rows:
        raise UserError(f"{path.name} has no rows")
    return rows


def _validate_row(row: Any, name: str, line_no: int) -> list[dict[str, Any]]:
    where = f"{name} line {line_no}"
    if not isinstance(row, dict) or not isinstance(row.get("messages"), list) or not row["messages"]:
        raise UserError(f"{where}: expected an object with a non-empty 'messages' list")
    for i, message in enumerate(row["messages"]):
        if not isinstance(message, dict):
            raise UserError(f"{where}: message {i} is not an object")
        if message.get("role") not in SUPPORTED_ROLES:
            raise UserError(f"{where}: message {i} has role {message.get('role')!r}; expected one of {SUPPORTED_ROLES}")
        if not isinstance(message.get("content"), str):
            raise UserError(f"{where}: message {i} has no string 'content'")
        weight = message.get("weight")
        if weight is not None and (isinstance(weight, bool) or weight not in (0, 1)):
            raise UserError(f"{where}: message {i} has weight {weight!r}; expected 0 or 1")
    if not any(m.get("weight", 1 if m["role"] == "assistant" else 0) for m in row["messages"]):
        raise UserError(f"{where}: no trained message (needs an assistant message with weight 1)")
    return row["messages"]


def tokenize_rows(tokenizer, rows, max_seq_len: int, name: str) -> list[dict[str, list[int]]]:
    """Platform-masked examples; rows whose trained tokens are all truncated away are dropped."""
    from jinja2 import TemplateError

    from whetstone.modelkit.chat import IGNORE_INDEX, ChatFormatError, tokenize_chat

    examples, dropped = [], []
    for line_no, messages in rows:
        try:
            example = tokenize_chat(tokenizer, messages, max_seq_len)
        except ChatFormatError as exc:
            raise UserError(f"{name} line {line_no}: {exc}") from exc
        except TemplateError as exc:  # e.g. raise_exception() in the model's own chat template
            raise UserError(f"{name} line {line_no}: chat template rejected the conversation ({exc})") from exc
        if any(label != IGNORE_INDEX for label in example["labels"][1:]):
            examples.append({"input_ids": example["input_ids"], "labels": example["labels"]})
        else:
            dropped.append(line_no)
    if dropped:
        log.warning("%s: %d rows have no trained tokens within max_seq_len=%d (lines %s...)",
                    name, len(dropped), max_seq_len, dropped[:10])
    if not examples:
        raise UserError(f"{name}: no row has trained tokens within max_seq_len={max_seq_len}")
    return examples


def linear_module_names(model) -> list[str]:
    """Sorted leaf names of every nn.Linear except the output head ('all-linear', but stable)."""
    import torch

    head = model.get_output_embeddings()
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not head
    }
    return sorted(names)


# --------------------------------------------------------------------------- trainer callback


def _platform_callback(events: EventStream, preemption: PreemptionFlag, every: int):
    """TrainerCallback: progress events, periodic/emergency checkpoints, SIGTERM stop."""
    from transformers import TrainerCallback

    class PlatformCallback(TrainerCallback):
        def __init__(self) -> None:
            self.emergency_checkpoint: Path | None = None
            self._stopping = False
            self._last = (time.perf_counter(), 0, 0)  # time, tokens seen, global step

        def on_train_begin(self, args, state, control, **kwargs):
            self._last = (time.perf_counter(), state.num_input_tokens_seen, state.global_step)
            events.emit("started", total_steps=state.max_steps, resumed_from_step=state.global_step)

        def on_step_end(self, args, state, control, **kwargs):
            if preemption.requested and state.global_step < state.max_steps:
                self._stopping = True
                control.should_save = True
                control.should_training_stop = True
            elif every and state.global_step % every == 0 and state.global_step < state.max_steps:
                control.should_save = True
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:
                return
            now, tokens, step = time.perf_counter(), state.num_input_tokens_seen, state.global_step
            last_time, last_tokens, last_step = self._last
            elapsed = max(now - last_time, 1e-9)
            samples = (step - last_step) * args.per_device_train_batch_size * args.gradient_accumulation_steps
            samples *= max(args.world_size, 1)
            self._last = (now, tokens, step)
            events.emit(
                "progress",
                step=step,
                total_steps=state.max_steps,
                epoch=round(state.epoch or 0.0, 4),
                loss=logs["loss"],
                grad_norm=logs.get("grad_norm"),
                learning_rate=logs.get("learning_rate"),
                tokens_per_s=round((tokens - last_tokens) / elapsed, 1),
                samples_per_s=round(samples / elapsed, 2),
                token_accuracy=logs.get("mean_token_accuracy"),
                tokens_seen=tokens,
            )

        def on_save(self, args, state, control, **kwargs):
            path = Path(args.output_dir, f"checkpoint-{state.global_step}").resolve()
            if self._stopping:
                self.emergency_checkpoint = path
            kind = "emergency" if self._stopping else "periodic"
            events.emit("checkpoint", kind=kind, step=state.global_step, path=str(path))

    return PlatformCallback()


# --------------------------------------------------------------------------- the recipe


class LoRASFTRecipe:
    """setup -> train -> save_checkpoint -> cleanup."""

    def __init__(self, cfg: RecipeConfig, events: EventStream, preemption: PreemptionFlag) -> None:
        self.cfg = cfg
        self.hp = cfg.hyperparameters
        self.events = events
        self.preemption = preemption
        self.tokenizer = None
        self.trainer = None
        self.callback = None
        self.train_dataset = None
        self.validation_rows: list | None = None
        self.train_output = None

    # ---- setup

    def setup(self) -> None:
        """Data first (cheap, fails fast on user errors), then tokenizer, model and trainer."""
        self._check_resume_dir()
        train_rows = read_chat_jsonl(self.cfg.train_file)
        validation_rows = read_chat_jsonl(self.cfg.validation_file) if self.cfg.validation_file else None
        self.tokenizer = self._load_tokenizer()
        self.train_dataset = self._dataset(
            tokenize_rows(self.tokenizer, train_rows, self.hp.max_seq_len, self.cfg.train_file.name)
        )
        if validation_rows is not None:
            tokenize_rows(self.tokenizer, validation_rows, self.hp.max_seq_len, self.cfg.validation_file.name)
            self.validation_rows = [messages for _, messages in validation_rows]
        self.trainer = self._build_trainer(self._load_model())

    def _load_tokenizer(self):
        from whetstone.modelkit.loading import ModelNotFoundError, load_tokenizer

        try:
            return load_tokenizer(self.cfg.base_model)
        except ModelNotFoundError as exc:
            raise PlatformError(f"base model: {exc}") from exc

    def _load_model(self):
        import torch

        from whetstone.modelkit.loading import ModelNotFoundError, load_model

        try:
            return load_model(self.cfg.base_model, dtype=self._dtype(torch))
        except ModelNotFoundError as exc:
            raise PlatformError(f"base model: {exc}") from exc

    def _build_trainer(self, model):
        """trl SFTTrainer on the pre-tokenized dataset (our labels are used as is) + LoRA."""
        import torch
        from peft import LoraConfig
        from transformers import PrinterCallback, set_seed
        from trl import SFTConfig, SFTTrainer

        set_seed(self.hp.seed)  # LoRA init
        self.callback = _platform_callback(self.events, self.preemption, self.hp.checkpoint_every_steps)
        trainer = SFTTrainer(
            model=model,
            args=self._training_args(SFTConfig, torch),
            train_dataset=self.train_dataset,
            processing_class=self.tokenizer,
            peft_config=LoraConfig(
                r=self.hp.lora_r,
                lora_alpha=self.hp.lora_alpha,
                lora_dropout=self.hp.lora_dropout,
                target_modules=linear_module_names(model),  # all decoder Linears; lm_head excluded
                bias="none",
                task_type="CAUSAL_LM",
            ),
            callbacks=[self.callback],
        )
        trainer.remove_callback(PrinterCallback)  # our events replace its dict prints
        return trainer

    def _dtype(self, torch):
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32

    def _dataset(self, examples):
        from datasets import Dataset

        return Dataset.from_list(examples)

    def _check_resume_dir(self) -> None:
        resume = self.cfg.resume_from
        if resume is not None and not (resume / "trainer_state.json").is_file():
            raise PlatformError(f"resume_from {resume} is not a trainer checkpoint (no trainer_state.json)")

    def _training_args(self, SFTConfig, torch):
        use_cuda = torch.cuda.is_available()
        return SFTConfig(
            output_dir=str(self.cfg.output_dir),
            num_train_epochs=self.hp.n_epochs,
            learning_rate=self.hp.learning_rate,
            per_device_train_batch_size=self.hp.batch_size,
            gradient_accumulation_steps=self.hp.gradient_accumulation_steps,
            lr_scheduler_type="cosine",
            warmup_steps=self.hp.warmup_ratio,  # a float in [0, 1) is a ratio of total steps
            weight_decay=0.0,
            max_grad_norm=1.0,
            seed=self.hp.seed,
            data_seed=self.hp.seed,
            max_length=self.hp.max_seq_len,
            packing=False,
            logging_strategy="steps",
            logging_steps=1,
            save_strategy="no",  # the platform callback decides when to checkpoint
            report_to="none",
            disable_tqdm=True,
            include_num_input_tokens_seen="non_padding",
            use_cpu=not use_cuda,
            bf16=use_cuda and torch.cuda.is_bf16_supported(),
            dataloader_num_workers=0,
        )

    # ---- train

    def train(self) -> bool:
        """Run (or resume) training; True when stopped by SIGTERM."""
        resume = str(self.cfg.resume_from) if self.cfg.resume_from else None
        self.train_output = self.trainer.train(resume_from_checkpoint=resume)
        return self.callback.emergency_checkpoint is not None

    # ---- save_checkpoint

    def save_checkpoint(self) -> Path:
        """Write output_dir/final (adapter + tokenizer + chat template) atomically."""
        final = self.cfg.output_dir / "final"
        staging = self.cfg.output_dir / "final.partial"
        shutil.rmtree(staging, ignore_errors=True)
        self.trainer.save_model(str(staging))  # adapter_model.safetensors, adapter_config.json, tokenizer
        (staging / "training_args.bin").unlink(missing_ok=True)  # a pickle: keep it out of the artifact
        (staging / "whetstone_training.json").write_text(json.dumps(self._summary(), indent=2) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
        state = self.trainer.state
        self.events.emit("checkpoint", kind="final", step=state.global_step, path=str(final))
        return final

    def _summary(self) -> dict[str, Any]:
        return {
            "job_id": self.cfg.job_id,
            "base_model": self.cfg.base_model,
            "method": self.cfg.method,
            "hyperparameters": asdict(self.hp),
            "global_step": self.trainer.state.global_step,
            "train_loss": self.train_loss(),
            "tokens": self.trainer.state.num_input_tokens_seen,
        }

    def train_loss(self) -> float | None:
        """Mean logged loss over ALL steps, including those of earlier (preempted) segments."""
        losses = [entry["loss"] for entry in self.trainer.state.log_history if "loss" in entry]
        if losses:
            return sum(losses) / len(losses)
        return self.train_output.training_loss if self.train_output else None

    def validation_metrics(self) -> dict[str, Any]:
        if not self.validation_rows:
            return {}
        from whetstone.modelkit.holdout import holdout_loss

        metrics = holdout_loss(self.trainer.model, self.tokenizer, self.validation_rows,
                               max_len=self.hp.max_seq_len, batch_size=self.hp.batch_size)
        return {"validation_loss": metrics["loss"], "validation_tokens": metrics["tokens"]}

    # ---- cleanup

    def cleanup(self) -> None:
        shutil.rmtree(self.cfg.output_dir / "final.partial", ignore_errors=True)
        self.trainer = None


# --------------------------------------------------------------------------- entrypoint


def _configure_logging() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")


def run(cfg: RecipeConfig, events: EventStream, preemption: PreemptionFlag, started: float) -> int:
    recipe = LoRASFTRecipe(cfg, events, preemption)
    try:
        recipe.setup()
        if preemption.requested:  # SIGTERM during setup: nothing new to checkpoint
            step = _checkpoint_step(cfg.resume_from)
            events.emit("preempted", step=step, checkpoint=str(cfg.resume_from) if cfg.resume_from else None)
            return 0
        if recipe.train():
            step = recipe.trainer.state.global_step
            events.emit("preempted", step=step, checkpoint=str(recipe.callback.emergency_checkpoint))
            return 0
        recipe.save_checkpoint()
        state = recipe.trainer.state
        events.emit(
            "completed",
            step=state.global_step,
            train_loss=recipe.train_loss(),
            tokens=state.num_input_tokens_seen,
            runtime_s=round(time.perf_counter() - started, 3),
            train_runtime_s=round(recipe.train_output.metrics.get("train_runtime", 0.0), 3),
            **recipe.validation_metrics(),
        )
        return 0
    finally:
        recipe.cleanup()


def _checkpoint_step(checkpoint: Path | None) -> int:
    if checkpoint is None:
        return 0
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return int(state.get("global_step", 0))


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    preemption = PreemptionFlag().install()  # FIRST: before any slow import or model load
    events = EventStream.claim_stdout()
    _configure_logging()
    parser = argparse.ArgumentParser(prog="python -m whetstone.trainer_agent.recipes.sft")
    parser.add_argument("--config", type=Path, required=True, help="recipe config JSON")
    args = parser.parse_args(argv)
    try:
        cfg = RecipeConfig.load(args.config)
        events.job_id = cfg.job_id
        return run(cfg, events, preemption, started)
    except RecipeError as exc:
        log.error("%s error: %s", exc.error_class, exc)
        events.emit("failed", error_class=exc.error_class, message=str(exc))
    except Exception as exc:  # noqa: BLE001 - anything unexpected is the platform's fault
        log.exception("recipe crashed")
        events.emit("failed", error_class="platform", message=f"{type(exc).__name__}: {exc}")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
