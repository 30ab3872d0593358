"""The recipe's CONFIG.json, written by the trainer agent (a contract with adapters/workspace.py).

Keys: job_id, base_model, train_file, output_dir (required); method (lora|qlora|full|dpo|
orpo|cpt, default lora), hyperparameters, validation_file, resume_from, and optionally
deepspeed (a DeepSpeed config dict or the path of one, from the agent's launcher) and
zero_init (load the model already partitioned: ZeRO-3 models above 13B).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import PlatformError, UserError
from .hyperparams import METHODS, Hyperparameters
from .safe_load import verify_checkpoint_pickles


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
    deepspeed: dict[str, Any] | None = None
    zero_init: bool = False
    reinforcement: dict[str, Any] | None = None   # method reinforcement: grader and knobs (ReinforcementSpec)

    @classmethod
    def load(cls, path: Path) -> RecipeConfig:
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise PlatformError(f"cannot read recipe config {path}: {exc}", code="bad_recipe_config") from exc
        missing = [k for k in ("job_id", "base_model", "train_file", "output_dir") if not raw.get(k)]
        if missing:
            raise PlatformError(f"recipe config {path} is missing: {', '.join(missing)}", code="bad_recipe_config")
        method = raw.get("method") or "lora"
        if method not in METHODS:
            raise UserError(f"unsupported method {method!r} (supported: {', '.join(METHODS)})",
                            code="unsupported_method")
        optional = {k: Path(raw[k]).resolve() for k in ("validation_file", "resume_from") if raw.get(k)}
        cfg = cls(
            job_id=str(raw["job_id"]),
            base_model=str(raw["base_model"]),
            train_file=Path(raw["train_file"]).resolve(),
            output_dir=Path(raw["output_dir"]).resolve(),
            hyperparameters=Hyperparameters.parse(raw.get("hyperparameters") or {}),
            method=method,
            deepspeed=_deepspeed_config(raw.get("deepspeed")),
            zero_init=bool(raw.get("zero_init")),
            reinforcement=raw.get("reinforcement"),
            **optional,
        )
        cfg.check_distributed()
        return cfg

    def check_distributed(self) -> None:
        stage = (self.deepspeed or {}).get("zero_optimization", {}).get("stage")
        if self.method == "qlora" and stage == 3:
            raise UserError("QLoRA cannot run with DeepSpeed ZeRO-3 (4-bit weights cannot be sharded); "
                            "use ZeRO-1/2 or method lora", code="qlora_zero3")

    def data_fingerprint(self) -> str:
        """Identity of what reference log-probs depend on: data, base model, truncation."""
        h = hashlib.sha256()
        for path in (self.train_file, self.validation_file):
            h.update(path.read_bytes() if path is not None and path.is_file() else b"-")
        h.update(f"{self.base_model}|{self.hyperparameters.max_seq_len}|{self.method}".encode())
        return h.hexdigest()


def _deepspeed_config(value: Any) -> dict[str, Any] | None:
    if value is None or isinstance(value, dict):
        return value
    try:
        return json.loads(Path(value).read_text())
    except (OSError, TypeError, json.JSONDecodeError) as exc:
        raise PlatformError(f"cannot read DeepSpeed config {value!r}: {exc}", code="bad_recipe_config") from exc


def read_resume_state(resume: Path | None) -> dict[str, Any] | None:
    """trainer_state.json of the checkpoint to resume from; an unreadable or unsafe one (a pickle that
    would run code) is a platform error."""
    if resume is None:
        return None
    state_file = resume / "trainer_state.json"
    if not state_file.is_file():
        raise PlatformError(f"resume_from {resume} is not a trainer checkpoint (no trainer_state.json)",
                            code="unreadable_checkpoint")
    try:
        state = json.loads(state_file.read_text())
        int(state["global_step"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PlatformError(f"resume_from {resume}: unreadable trainer_state.json ({exc})",
                            code="unreadable_checkpoint") from exc
    weights = ("adapter_model.safetensors", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    if not any((resume / name).is_file() for name in weights):
        raise PlatformError(f"resume_from {resume} has no weights", code="unreadable_checkpoint")
    verify_checkpoint_pickles(resume)  # before transformers or DeepSpeed unpickles anything of it
    return state
