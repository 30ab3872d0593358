"""Stage 1 plumbing: the benchmark task directory (validate, stage, import) and lm-eval runs.

A task directory holds lm-eval task YAMLs (`*.yaml`, one task each) over local data files
(`dataset_path: json|csv|parquet`, `dataset_kwargs.data_files`), paths relative to the YAML or
absolute. Before a run the YAMLs are staged into a temporary include dir with absolute paths,
so the shipped suites and imported ones work wherever the directory lives."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..domain.stages import SuiteScore

LOCAL_BUILDERS = ("json", "csv", "parquet")
SHIPPED_TASKS = Path(__file__).resolve().parents[1] / "suites" / "benchmarks"


class TaskDirError(ValueError):
    """The benchmark directory is missing or malformed; the message names the file and field."""


class _Loader(yaml.SafeLoader):
    pass


# lm-eval YAMLs may name python functions (`!function utils.process_docs`): keep them as text
_Loader.add_constructor("!function", lambda loader, node: f"!function {loader.construct_scalar(node)}")


@dataclass(frozen=True)
class Suite:
    name: str
    yaml_path: Path
    config: dict[str, Any]
    data_files: dict[str, Path]
    chance: float


def _data_files(cfg: dict[str, Any], where: Path) -> dict[str, Path]:
    files = (cfg.get("dataset_kwargs") or {}).get("data_files")
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


def _chance(cfg: dict[str, Any], files: dict[str, Path]) -> float:
    meta = cfg.get("metadata") or {}
    if isinstance(meta.get("chance"), int | float):
        return float(meta["chance"])
    split = cfg.get("test_split") or next(iter(files))
    path = files.get(split)
    if path is not None and path.suffix in (".jsonl", ".json"):
        inverse = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    choices = json.loads(line).get("choices")
                    if isinstance(choices, list) and choices:
                        inverse.append(1 / len(choices))
        if inverse:
            return sum(inverse) / len(inverse)
    return 0.25


def load_suite(path: Path) -> Suite:
    try:
        cfg = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise TaskDirError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(cfg, dict):
        raise TaskDirError(f"{path}: expected a mapping of task settings")
    name = cfg.get("task")
    if not isinstance(name, str) or not name:
        raise TaskDirError(f"{path}: 'task' (the task name) is missing")
    if "include" in cfg:
        raise TaskDirError(f"{path}: 'include' of other YAMLs is not supported; inline the settings")
    if cfg.get("dataset_path") not in LOCAL_BUILDERS:
        raise TaskDirError(f"{path}: dataset_path must be one of {', '.join(LOCAL_BUILDERS)} (local files; "
                           f"got {cfg.get('dataset_path')!r}); nothing can be downloaded")
    if cfg.get("output_type") != "multiple_choice":
        raise TaskDirError(f"{path}: output_type must be multiple_choice (got {cfg.get('output_type')!r})")
    for key in ("doc_to_text", "doc_to_choice", "doc_to_target"):
        if key not in cfg:
            raise TaskDirError(f"{path}: '{key}' is missing")
    files = _data_files(cfg, path)
    split = cfg.get("test_split") or cfg.get("validation_split")
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
        cfg = dict(s.config)
        cfg["dataset_kwargs"] = {**(cfg.get("dataset_kwargs") or {}),
                                 "data_files": {k: str(v) for k, v in s.data_files.items()}}
        (dest / f"{s.name}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return dest


def run_lm_eval(base_dir: str, adapter_dir: str | None, suites: list[Suite], *, batch_size: int = 32,
                limit: int | None = None) -> dict[str, SuiteScore]:
    """Accuracy per suite for the base model, or base + LoRA adapter (`peft=`)."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import lm_eval
    from lm_eval.tasks import TaskManager

    with tempfile.TemporaryDirectory(prefix="eval-tasks-") as tmp:
        include = stage_include_dir(suites, Path(tmp))
        args = f"pretrained={base_dir},dtype=float32" + (f",peft={adapter_dir}" if adapter_dir else "")
        out = lm_eval.simple_evaluate(model="hf", model_args=args, tasks=[s.name for s in suites],
                                      task_manager=TaskManager(include_path=str(include), include_defaults=False),
                                      device="cpu", batch_size=batch_size, limit=limit, log_samples=False,
                                      verbosity="ERROR")
    results = out["results"]
    scores = {}
    for s in suites:
        r = results.get(s.name) or {}
        acc = r.get("acc,none", r.get("acc"))
        if acc is None:
            raise RuntimeError(f"lm-eval returned no accuracy for suite {s.name}")
        n = int((out.get("n-samples") or {}).get(s.name, {}).get("effective", 0))
        scores[s.name] = SuiteScore(float(acc), n, s.chance)
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
        files = {}
        for split, path in s.data_files.items():
            shutil.copy2(path, target_dir / path.name)
            files[split] = path.name
        cfg = {**s.config, "dataset_kwargs": {**(s.config.get("dataset_kwargs") or {}), "data_files": files}}
        (target_dir / f"{s.name}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return [s.name for s in suites]
