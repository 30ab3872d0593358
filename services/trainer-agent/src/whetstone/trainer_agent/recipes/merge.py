"""The merge recipe: a registered adapter merged into its base, run by the trainer agent as a child
process like the training recipes (same event protocol on stdout, same SIGTERM flag).

    python -m whetstone.trainer_agent.recipes.merge --config CONFIG.json

CONFIG: `domain/recipe_io.MergeConfig`, written by the agent (`trainer_agent/usecases/merges.py`).

setup (adapter safetensors only) -> merge (`merge_and_unload` onto the base, the trainer's
`merged_writer`) -> check the output (safetensors and text files only, never a pickle) -> events
`merged` (the directory for the agent to upload) and `completed`. SIGTERM before the output is
written: `preempted` (the merge restarts from the beginning). A failure: one `failed` event.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError
from whetstone.contracts import TOLERANT
from whetstone.contracts.enums import ErrorClass

from ..domain.recipe_io import (
    Completed,
    Failed,
    MergeConfig,
    Merged,
    Preempted,
    Started,
)
from .errors import PlatformError, RecipeError, UserError, is_out_of_memory
from .protocol import EventStream, PreemptionFlag

log = logging.getLogger("whetstone.trainer_agent.recipes.merge")

ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
# what a merged model directory may hold: weights as safetensors, configs, tokenizer and chat template
SAFE_SUFFIXES = (".safetensors", ".json", ".jinja", ".txt", ".model", ".md")


def load_config(path: Path) -> MergeConfig:
    try:
        return MergeConfig.model_validate_json(Path(path).read_text(encoding="utf-8"), context=TOLERANT)
    except OSError as exc:
        raise PlatformError(f"cannot read merge config {path}: {exc}", code="bad_recipe_config") from exc
    except ValidationError as exc:
        where = ", ".join(".".join(map(str, e["loc"])) for e in exc.errors())
        raise PlatformError(f"merge config {path}: bad or missing {where}", code="bad_recipe_config") from exc


class AdapterConfig(BaseModel):
    """What the merge reads of PEFT's adapter_config.json."""

    model_config = ConfigDict(extra="ignore")
    peft_type: str | None = None


def check_adapter(adapter_dir: Path) -> None:
    """A PEFT LoRA adapter in safetensors: the only form the merge loads (a pickle could run code)."""
    missing = [name for name in ADAPTER_FILES if not (adapter_dir / name).is_file()]
    if missing:
        raise UserError(f"the model's artifact has no {' or '.join(missing)}: only a safetensors LoRA adapter "
                        "can be merged", code="no_safetensors_adapter")
    try:
        config = AdapterConfig.model_validate_json((adapter_dir / "adapter_config.json").read_text())
    except ValidationError as exc:
        raise PlatformError(f"adapter_config.json is not JSON: {exc}", code="adapter_corrupted") from exc
    if config.peft_type != "LORA":
        raise UserError(f"only LoRA adapters can be merged, not peft_type {config.peft_type!r}",
                        code="unsupported_adapter")


def check_output(out: Path) -> list[str]:
    """The merged directory's files; PlatformError if any is not safetensors or text (a pickle)."""
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    unsafe = [f for f in files if not f.lower().endswith(SAFE_SUFFIXES)]
    if unsafe:
        raise PlatformError(f"the merged model holds files that are not safetensors: {', '.join(unsafe)}",
                            code="unsafe_merged_output")
    if not any(f.endswith(".safetensors") for f in files):
        raise PlatformError("the merge wrote no safetensors weights", code="no_merged_weights")
    return files


def run(cfg: MergeConfig, events: EventStream, preemption: PreemptionFlag) -> int:
    from transformers import AutoTokenizer

    from .checkpointing import merged_writer
    from .modeling import _device

    adapter_dir, out = cfg.adapter_dir, cfg.output_dir
    events.emit(Started(total_steps=1))
    check_adapter(adapter_dir)
    # the tokenizer the adapter was trained with (its chat template), else the base's
    has_tokenizer = any((adapter_dir / name).is_file() for name in TOKENIZER_FILES)
    tokenizer = AutoTokenizer.from_pretrained(str(adapter_dir) if has_tokenizer else cfg.base_model)
    if preemption.requested:
        events.emit(Preempted(step=0))
        return 0
    began = time.perf_counter()
    device = _device()   # the merge job's own device (a GPU node: the one GPU it was placed on)
    merged_writer(cfg.base_model, tokenizer, {"": device} if device != "cpu" else None)(adapter_dir, out)
    files = check_output(out)
    merge_s = round(time.perf_counter() - began, 3)
    events.emit(Merged(path=out, files=len(files), merge_s=merge_s))
    events.emit(Completed(step=1, merge_s=merge_s))
    return 0


def execute(config_path: Path, events: EventStream, preemption: PreemptionFlag) -> int:
    """Every failure becomes ONE `failed` event; returns the exit status."""
    try:
        cfg = load_config(config_path)
        events.job_id = cfg.job_id
        return run(cfg, events, preemption)
    except RecipeError as exc:
        log.error("%s error: %s", exc.error_class, exc)
        events.emit(exc.event())
    except Exception as exc:
        if is_out_of_memory(exc):
            events.emit(Failed(error_class=ErrorClass.AMBIGUOUS, code="out_of_memory",
                               message=f"{type(exc).__name__}: {exc}",
                               advice=["request a device with more memory for the merge"]))
        else:
            log.exception("merge crashed")
            events.emit(Failed(code="merge_crashed", message=f"{type(exc).__name__}: {exc}"))
    return 1


def main(argv: list[str] | None = None) -> int:
    preemption = PreemptionFlag().install()  # FIRST: before any slow import or model load
    events = EventStream.claim_stdout()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = argparse.ArgumentParser(prog="python -m whetstone.trainer_agent.recipes.merge")
    parser.add_argument("--config", type=Path, required=True, help="merge config JSON")
    return execute(parser.parse_args(argv).config, events, preemption)


if __name__ == "__main__":
    raise SystemExit(main())
