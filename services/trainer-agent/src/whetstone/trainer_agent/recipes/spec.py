"""The recipe's side of CONFIG.json (`domain/recipe_io.TrainingConfig`, written by the agent's
adapters/workspace.py): parsed once, paths resolved, hyperparameters validated, the DeepSpeed config
read; and the checks of the checkpoint to resume from.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from whetstone.contracts import TOLERANT
from whetstone.contracts.enums import Method

from ..domain.deepspeed_json import DeepSpeedConfig
from ..domain.recipe_io import RecipeReinforcement, TrainingConfig
from .checkpointing import TRAINER_STATE_FILE, TrainerStateFile
from .errors import PlatformError, UserError
from .hyperparams import Hyperparameters
from .safe_load import verify_checkpoint_pickles


@dataclass(frozen=True)
class RecipeConfig:
    job_id: str
    base_model: str
    train_file: Path
    output_dir: Path
    hyperparameters: Hyperparameters
    method: Method = Method.LORA
    validation_file: Path | None = None
    resume_from: Path | None = None
    deepspeed: DeepSpeedConfig | None = None
    zero_init: bool = False
    reinforcement: RecipeReinforcement | None = None
    max_shard_bytes: int | None = None   # the final full weights' shard size (None: transformers' own)

    @classmethod
    def load(cls, path: Path) -> RecipeConfig:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise PlatformError(f"cannot read recipe config {path}: {exc}", code="bad_recipe_config") from exc
        try:
            raw = TrainingConfig.model_validate_json(text, context=TOLERANT)
        except ValidationError as exc:
            raise config_error(path, exc) from exc
        cfg = cls(
            job_id=raw.job_id,
            base_model=raw.base_model,
            train_file=raw.train_file.resolve(),
            output_dir=raw.output_dir.resolve(),
            hyperparameters=Hyperparameters.parse(raw.hyperparameters),
            method=raw.method,
            validation_file=raw.validation_file.resolve() if raw.validation_file else None,
            resume_from=raw.resume_from.resolve() if raw.resume_from else None,
            deepspeed=_deepspeed_config(raw.deepspeed),
            zero_init=raw.zero_init,
            reinforcement=raw.reinforcement,
            max_shard_bytes=raw.max_shard_bytes,
        )
        cfg.check_distributed()
        return cfg

    def check_distributed(self) -> None:
        if self.method == Method.QLORA and self.zero_stage == 3:
            raise UserError("QLoRA cannot run with DeepSpeed ZeRO-3 (4-bit weights cannot be sharded); "
                            "use ZeRO-1/2 or method lora", code="qlora_zero3")

    @property
    def zero_stage(self) -> int | None:
        return self.deepspeed.zero_stage if self.deepspeed else None

    def data_fingerprint(self) -> str:
        """Identity of what reference log-probs depend on: data, base model, truncation."""
        h = hashlib.sha256()
        for path in (self.train_file, self.validation_file):
            h.update(path.read_bytes() if path is not None and path.is_file() else b"-")
        h.update(f"{self.base_model}|{self.hyperparameters.max_seq_len}|{self.method}".encode())
        return h.hexdigest()


def config_error(path: Path, exc: ValidationError) -> PlatformError | UserError:
    """An unknown method is the user's; any other bad field the agent's (named with its value)."""
    first = exc.errors()[0]
    where = ".".join(map(str, first["loc"])) or "config"
    if first["loc"][:1] == ("method",):
        return UserError(f"unsupported method {first['input']!r} (supported: {', '.join(Method)})",
                         code="unsupported_method")
    missing = [".".join(map(str, e["loc"])) for e in exc.errors() if e["type"] == "missing"]
    if missing:
        return PlatformError(f"recipe config {path} is missing: {', '.join(missing)}", code="bad_recipe_config")
    return PlatformError(f"recipe config {path}: {where}: {first['msg']}", code="bad_recipe_config")


def _deepspeed_config(value: Path | DeepSpeedConfig | None) -> DeepSpeedConfig | None:
    """The config's `deepspeed`: given inline, or read from the JSON file it names."""
    if not isinstance(value, Path):
        return value
    try:
        return DeepSpeedConfig.model_validate_json(value.read_text(), context=TOLERANT)
    except (OSError, ValueError) as exc:   # pydantic's ValidationError is a ValueError
        raise PlatformError(f"cannot read DeepSpeed config {value}: {exc}", code="bad_recipe_config") from exc


def read_resume_state(resume: Path | None) -> TrainerStateFile | None:
    """trainer_state.json of the checkpoint to resume from; an unreadable or unsafe one (a pickle that
    would run code) is a platform error."""
    if resume is None:
        return None
    state_file = resume / TRAINER_STATE_FILE
    if not state_file.is_file():
        raise PlatformError(f"resume_from {resume} is not a trainer checkpoint (no trainer_state.json)",
                            code="unreadable_checkpoint")
    try:
        state = TrainerStateFile.model_validate_json(state_file.read_text())
    except (OSError, ValueError) as exc:   # pydantic's ValidationError is a ValueError
        raise PlatformError(f"resume_from {resume}: unreadable trainer_state.json ({exc})",
                            code="unreadable_checkpoint") from exc
    weights = ("adapter_model.safetensors", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    if not any((resume / name).is_file() for name in weights):
        raise PlatformError(f"resume_from {resume} has no weights", code="unreadable_checkpoint")
    verify_checkpoint_pickles(resume)  # before transformers or DeepSpeed unpickles anything of it
    return state
