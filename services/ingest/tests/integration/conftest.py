"""Helpers of the ingest integration tests: dataset files, the tiny base model, running the gate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from whetstone.ingest.adapters.formats import open_source
from whetstone.ingest.config import IngestSettings
from whetstone.ingest.usecases.gates import GateRequest, archive_limits, make_gate, reference_index, toxicity_classifier
from whetstone.ingest.usecases.pipeline import GateResult


def chat_row(i: int, answer: str | None = None) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"Question number {i}: what is {i} plus {i}?"},
                         {"role": "assistant", "content": answer or f"The answer to question {i} is {2 * i}."}]}


def good_rows(n: int = 12, start: int = 0) -> list[dict[str, Any]]:
    return [chat_row(i) for i in range(start, start + n)]


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_bytes(b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows))
    return path


def run_gate(path: Path, tmp: Path, *, settings: IngestSettings | None = None, request: GateRequest | None = None,
             references: list[Path] = (), tokenizer=None, name: str | None = None) -> GateResult:
    """What the service and the CLI run, on a local file."""
    s = settings or IngestSettings()
    gate = make_gate(s, request or GateRequest(), tokenizer=tokenizer,
                     references=reference_index(s, list(references)), toxicity=toxicity_classifier(s))
    source = open_source(path, name=name, workdir=tmp / "source", max_line_bytes=s.max_line_bytes,
                         image_line_bytes=s.max_record_bytes, limits=archive_limits(s))
    return gate.run(source, tmp / "gate")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def errors(report: dict[str, Any]) -> dict[int | None, list[str]]:
    """A gate report's row errors: line -> codes."""
    by_line: dict[int | None, list[str]] = {}
    for e in report["errors"]:
        by_line.setdefault(e["line"], []).append(e["code"])
    return by_line


@pytest.fixture(scope="session")
def ingest_tiny_model(tmp_path_factory) -> Path:
    from whetstone.modelkit.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("ingest-tiny") / "tiny", seed=0)


@pytest.fixture
def kit():
    """The helpers above (test modules cannot import conftest under --import-mode=importlib)."""
    from types import SimpleNamespace

    return SimpleNamespace(chat_row=chat_row, good_rows=good_rows, write_jsonl=write_jsonl, run_gate=run_gate,
                           read_jsonl=read_jsonl, errors=errors)
