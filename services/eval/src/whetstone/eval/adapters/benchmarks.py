"""Stage 1 plumbing: the benchmark task directory (validate, stage, import) and lm-eval runs.

A task directory holds lm-eval task YAMLs (`*.yaml`, one task each) over local data files
(`dataset_path: json|csv|parquet`, `dataset_kwargs.data_files`), paths relative to the YAML or
absolute. Before a run the YAMLs are staged into a temporary include dir with absolute paths,
so the shipped suites and imported ones work wherever the directory lives."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..domain.stages import SuiteScore

LOCAL_BUILDERS = ("json", "csv", "parquet")
SHIPPED_TASKS = Path(__file__).resolve().parents[1] / "suites" / "benchmarks"


class TaskDirError(ValueError):
    """The benchmark directory is missing or malformed; the message names the file and field."""


class _Loader(yaml.SafeLoader):
    pass


# lm-eval YAMLs may name python functions (`!function utils.process_docs`): keep them as text
_Loader.add_constructor("!function", lambda loader, node: f"!function {loader.construct_scalar(node)}")


class _DatasetKwargs(BaseModel):
    model_config = ConfigDict(extra="allow")
    data_files: object = None


class _Metadata(BaseModel):
    model_config = ConfigDict(extra="allow")
    chance: object = None


class TaskConfig(BaseModel):
    """An lm-eval task YAML: the settings read here are typed; every other setting is kept as written."""

    model_config = ConfigDict(extra="allow")
    task: object = None
    include: object = None
    dataset_path: object = None
    output_type: object = None
    doc_to_text: object = None
    doc_to_choice: object = None
    doc_to_target: object = None
    test_split: str | None = None
    validation_split: str | None = None
    dataset_kwargs: _DatasetKwargs | None = None
    metadata: _Metadata | None = None

    def with_data_files(self, files: dict[str, str]) -> dict[str, Any]:
        """The YAML's settings as written, with `dataset_kwargs.data_files` replaced."""
        kwargs = {**(self.dataset_kwargs.model_dump() if self.dataset_kwargs else {}), "data_files": files}
        return {**self.model_dump(exclude_unset=True), "dataset_kwargs": kwargs}


class _RowChoices(BaseModel):
    choices: object = None


@dataclass(frozen=True)
class Suite:
    name: str
    yaml_path: Path
    config: TaskConfig
    data_files: dict[str, Path]
    chance: float


def _data_files(cfg: TaskConfig, where: Path) -> dict[str, Path]:
    files = cfg.dataset_kwargs.data_files if cfg.dataset_kwargs else None
    if isinstance(files, str):
        files = {"test": files}
    if not isinstance(files, dict) or not files:
        raise TaskDirError(f"{where}: dataset_kwargs.data_files must name the local data file(s)")
    out = {}
    for split, rel in files.items():
        if not isinstance(rel, str):
            raise TaskDirError(f"{where}: dataset_kwargs.data_files.{split} must be one path")
        path = Path(rel) if os.path.isabs(rel) else where.parent / rel
        if not path.is_file():
            raise TaskDirError(f"{where}: data file {rel} ({split}) does not exist")
        out[split] = path.resolve()
    return out


def _chance(cfg: TaskConfig, files: dict[str, Path]) -> float:
    chance = cfg.metadata.chance if cfg.metadata else None
    if isinstance(chance, int | float):
        return float(chance)
    split = cfg.test_split or next(iter(files))
    path = files.get(split)
    if path is not None and path.suffix in (".jsonl", ".json"):
        inverse = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    choices = _RowChoices.model_validate_json(line).choices
                    if isinstance(choices, list) and choices:
                        inverse.append(1 / len(choices))
        if inverse:
            return sum(inverse) / len(inverse)
    return 0.25


def load_suite(path: Path) -> Suite:
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise TaskDirError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(raw, dict):
        raise TaskDirError(f"{path}: expected a mapping of task settings")
    try:
        cfg = TaskConfig.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise TaskDirError(f"{path}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from exc
    name = cfg.task
    if not isinstance(name, str) or not name:
        raise TaskDirError(f"{path}: 'task' (the task name) is missing")
    if "include" in cfg.model_fields_set:
        raise TaskDirError(f"{path}: 'include' of other YAMLs is not supported; inline the settings")
    if cfg.dataset_path not in LOCAL_BUILDERS:
        raise TaskDirError(f"{path}: dataset_path must be one of {', '.join(LOCAL_BUILDERS)} (local files; "
                           f"got {cfg.dataset_path!r}); nothing can be downloaded")
    if cfg.output_type != "multiple_choice":
        raise TaskDirError(f"{path}: output_type must be multiple_choice (got {cfg.output_type!r})")
    for key in ("doc_to_text", "doc_to_choice", "doc_to_target"):
        if key not in cfg.model_fields_set:
            raise TaskDirError(f"{path}: '{key}' is missing")
    files = _data_files(cfg, path)
    split = cfg.test_split or cfg.validation_split
    if split not in files:
        raise TaskDirError(f"{path}: test_split {split!r} has no entry in dataset_kwargs.data_files")
    return Suite(name, path, cfg, files, _chance(cfg, files))


def load_task_dir(task_dir: Path) -> list[Suite]:
    task_dir = Path(task_dir)
    if not task_dir.is_dir():
        raise TaskDirError(f"benchmark directory {task_dir} does not exist")
    paths = sorted(task_dir.glob("*.yaml")) + sorted(task_dir.glob("*/*.yaml"))
    if not paths:
        raise TaskDirError(f"benchmark directory {task_dir} has no task YAML files")
    suites = [load_suite(p) for p in paths]
    names = [s.name for s in suites]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise TaskDirError(f"benchmark directory {task_dir}: task names used twice: {', '.join(dupes)}")
    return suites


def fingerprint(suites: list[Suite]) -> str:
    """sha256 over every YAML and data file: the cache key part that says 'same benchmark'."""
    h = hashlib.sha256()
    for s in sorted(suites, key=lambda s: s.name):
        h.update(s.name.encode() + b"\0" + s.yaml_path.read_bytes())
        for split in sorted(s.data_files):
            h.update(split.encode() + b"\0" + s.data_files[split].read_bytes())
    return h.hexdigest()


def stage_include_dir(suites: list[Suite], dest: Path) -> Path:
    """Write the YAMLs with absolute data file paths into `dest` (lm-eval's include_path)."""
    dest.mkdir(parents=True, exist_ok=True)
    for s in suites:
        cfg = s.config.with_data_files({k: str(v) for k, v in s.data_files.items()})
        (dest / f"{s.name}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return dest


class _SuiteResult(BaseModel):
    acc_none: float | None = Field(default=None, alias="acc,none")
    acc: float | None = None


class _Samples(BaseModel):
    effective: int = 0


class _LmEvalRun(BaseModel):
    """The parts of `lm_eval.simple_evaluate`'s answer read here."""

    results: dict[str, _SuiteResult] = Field(default_factory=dict)
    n_samples: dict[str, _Samples] = Field(default_factory=dict, alias="n-samples")


def is_vision_base(base_dir: str) -> bool:
    """A local vision-language base: its text benchmarks run on its language side."""
    from whetstone.modelkit.loading import has_vision_config, is_local_ref

    return is_local_ref(base_dir) and has_vision_config(Path(base_dir))


def _language_side(base_dir: str, adapter_dir: str | None, batch_size: int) -> Any:
    """lm-eval's HFLM over a vision-language base loaded whole (modelkit's `load_model`), the adapter
    merged in: text benchmarks only ever give it token ids, so its language model answers them (lm-eval's
    own loader uses AutoModelForCausalLM, which refuses a LLaVA config)."""
    from lm_eval.models.huggingface import HFLM
    from whetstone.modelkit.loading import load_model, load_tokenizer

    model = load_model(base_dir, dtype="float32")
    if adapter_dir:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    model.eval()
    return HFLM(pretrained=model, tokenizer=load_tokenizer(base_dir), backend="causal", batch_size=batch_size)


def _hf_model_args(base_dir: str, candidate_dir: str | None) -> str:
    """lm-eval's `hf` model_args: the base, the base + a LoRA adapter (`peft=`), or a full-weight candidate
    (a full fine-tune or continued pre-training) loaded as the model itself with the base's tokenizer."""
    from .generation import holds_full_weights

    if candidate_dir and holds_full_weights(candidate_dir):
        return f"pretrained={candidate_dir},tokenizer={base_dir},dtype=float32"
    return f"pretrained={base_dir},dtype=float32" + (f",peft={candidate_dir}" if candidate_dir else "")


def run_lm_eval(base_dir: str, adapter_dir: str | None, suites: list[Suite], *, batch_size: int = 32,
                limit: int | None = None) -> dict[str, SuiteScore]:
    """Accuracy per suite for the base model, or base + LoRA adapter (`peft=`), or full weights in
    `adapter_dir` (see `_hf_model_args`). A vision-language base is scored on its language side
    (`_language_side`)."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import lm_eval
    from lm_eval.tasks import TaskManager

    vision = is_vision_base(base_dir)
    with tempfile.TemporaryDirectory(prefix="eval-tasks-") as tmp:
        include = stage_include_dir(suites, Path(tmp))
        tasks = TaskManager(include_path=str(include), include_defaults=False)
        if vision:
            out = lm_eval.simple_evaluate(model=_language_side(base_dir, adapter_dir, batch_size),
                                          tasks=[s.name for s in suites], task_manager=tasks, limit=limit,
                                          log_samples=False, verbosity="ERROR")
        else:
            args = _hf_model_args(base_dir, adapter_dir)
            out = lm_eval.simple_evaluate(model="hf", model_args=args, tasks=[s.name for s in suites],
                                          task_manager=tasks, device="cpu", batch_size=batch_size, limit=limit,
                                          log_samples=False, verbosity="ERROR")
    run = _LmEvalRun.model_validate(out)
    scores = {}
    for s in suites:
        r = run.results.get(s.name) or _SuiteResult()
        acc = r.acc_none if r.acc_none is not None else r.acc
        if acc is None:
            raise RuntimeError(f"lm-eval returned no accuracy for suite {s.name}")
        n = run.n_samples[s.name].effective if s.name in run.n_samples else 0
        scores[s.name] = SuiteScore(acc, n, s.chance)
    return scores


def import_tasks(source: Path, dest: Path) -> list[str]:
    """Validate an lm-eval style task directory and copy it (YAMLs + their data) under `dest`.

    Every YAML is checked before anything is copied; data paths become relative to the copy."""
    suites = load_task_dir(Path(source))
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    has_tasks = any(dest.glob("*.yaml")) or any(dest.glob("*/*.yaml"))
    existing = {s.name for s in load_task_dir(dest)} if has_tasks else set()
    clash = sorted(existing & {s.name for s in suites})
    if clash:
        raise TaskDirError(f"{dest} already has task(s) {', '.join(clash)}; remove them first")
    for s in suites:
        target_dir = dest / s.name
        target_dir.mkdir(parents=True, exist_ok=True)
        files: dict[str, str] = {}
        for split, path in s.data_files.items():
            shutil.copy2(path, target_dir / path.name)
            files[split] = path.name
        cfg = s.config.with_data_files(files)
        (target_dir / f"{s.name}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return [s.name for s in suites]
