"""Contamination reference sets: benchmark test splits and tenants' own eval sets -> ReferenceIndex.

A reference set is a file (JSONL, CSV, Parquet, or .txt with one item per line); its
name is the file's stem. An item's text is every string (and list of strings) in it,
e.g. question + choices + answer, so a training example that copies the question and
its answer matches. Benchmarks can also come from the Hub (MMLU, HellaSwag, ARC,
TruthfulQA, GSM8K test splits) when it is reachable; they are cached locally as JSONL
so later runs work offline.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..domain.contamination import ReferenceIndex
from ..domain.issues import Issue

REFERENCE_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".txt")
HUB_BENCHMARKS: dict[str, tuple[str, str | None, str]] = {
    "mmlu": ("cais/mmlu", "all", "test"),
    "hellaswag": ("Rowan/hellaswag", None, "validation"),
    "arc": ("allenai/ai2_arc", "ARC-Challenge", "test"),
    "truthfulqa": ("truthfulqa/truthful_qa", "generation", "validation"),
    "gsm8k": ("openai/gsm8k", "main", "test"),
}


def item_text(item: Any) -> str:
    """All the text of one benchmark item."""
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        return "\n".join(t for v in item.values() if (t := item_text(v)))
    if isinstance(item, list):
        return "\n".join(t for v in item if (t := item_text(v)))
    return ""


def read_items(path: Path) -> Iterator[str]:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.strip():
                    try:
                        yield item_text(json.loads(line))
                    except json.JSONDecodeError:
                        yield line
    elif suffix == ".csv":
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            for row in csv.DictReader(f):
                yield item_text(row)
    elif suffix == ".parquet":
        import pyarrow.parquet as pq  # noqa: PLC0415

        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                yield item_text(row)
    else:
        with open(path, encoding="utf-8", errors="replace") as f:
            yield from (line for line in f if line.strip())


def reference_files(dirs: Iterable[Path]) -> list[Path]:
    files: list[Path] = []
    for d in dirs:
        d = Path(d)
        if d.is_file():
            files.append(d)
        elif d.is_dir():
            files += sorted(p for p in d.iterdir() if p.is_file() and p.suffix.lower() in REFERENCE_SUFFIXES)
    return files


def build_index(files: Iterable[Path], index: ReferenceIndex | None = None,
                problems: list[Issue] | None = None) -> ReferenceIndex:
    """Add every file as a set named by its stem; unreadable files become warnings in `problems`."""
    index = index or ReferenceIndex()
    for path in files:
        try:
            index.add(path.stem, read_items(path))
        except Exception as exc:  # a broken reference file must not fail the dataset
            if problems is not None:
                problems.append(Issue("references_unavailable", f"reference set {path.name}: {str(exc)[:200]}"))
    return index


def fetch_hub_benchmarks(cache_dir: Path, names: Iterable[str] = tuple(HUB_BENCHMARKS),
                         problems: list[Issue] | None = None) -> list[Path]:
    """Local JSONL copies of the benchmark test splits, downloading the missing ones when the Hub is reachable."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    found = []
    for name in names:
        path = cache_dir / f"{name}.jsonl"
        if not path.is_file() and not offline:
            try:
                _download(name, path)
            except Exception as exc:
                if problems is not None:
                    problems.append(Issue("references_unavailable", f"benchmark {name}: {type(exc).__name__}"))
        if path.is_file():
            found.append(path)
        elif offline and problems is not None:
            problems.append(Issue("references_unavailable", f"benchmark {name}: not cached and the Hub is offline"))
    return found


def _download(name: str, path: Path) -> None:
    from datasets import load_dataset  # noqa: PLC0415

    repo, config, split = HUB_BENCHMARKS[name]
    ds = load_dataset(repo, config, split=split, streaming=True)
    tmp = path.with_suffix(".partial")
    with open(tmp, "w", encoding="utf-8") as f:
        for item in ds:
            f.write(json.dumps({"text": item_text(item)}, ensure_ascii=False) + "\n")
    tmp.rename(path)
