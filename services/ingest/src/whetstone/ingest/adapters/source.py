"""A dataset as a stream of records, whatever its file format."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..domain.issues import Issue


@dataclass
class Record:
    line: int
    origin: int = 0                  # 0: the training file, 1: a validation file/split given with it
    raw: bytes | None = None         # a JSONL line, parsed by the pipeline
    row: Any = None                  # an already-decoded row (Parquet, CSV, Arrow, Hub)
    issue: Issue | None = None


@dataclass
class Source:
    """A record stream plus what the report needs to know about it."""

    format: str
    total: int | None = None         # progress: bytes or rows, when known
    unit: str = "bytes"
    done: int = 0
    blank_lines: int = 0
    has_validation: bool = False
    notes: list[Issue] = field(default_factory=list)
    dialect: str | None = None       # CSV/TSV: how the file was read, named in errors that may come from a wrong guess

    def records(self) -> Iterator[Record]:  # pragma: no cover - interface
        raise NotImplementedError
