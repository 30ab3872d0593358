"""Write pass: the stored rows minus the removed ones -> tokenise (or estimate) -> statistics
-> train/validation files (and the tokenized rows), streaming."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ...domain.stats import DatasetStats
from .store import CandidateStore
from .tokenise import Tokenise

SIDES = ("train", "validation")


@dataclass
class Written:
    rows: list[int] = field(default_factory=lambda: [0, 0])       # per side: train, validation
    tokens: list[int] = field(default_factory=lambda: [0, 0])
    stats: DatasetStats = field(default_factory=DatasetStats)
    estimated_over: int = 0                                        # rows whose estimate exceeds max_seq_len
    images: int = 0                                                # images in the rows written
    image_rows: int = 0
    train_path: Path | None = None                                 # the cleaned files of the sides with rows
    validation_path: Path | None = None
    tokenized_paths: dict[str, Path] = field(default_factory=dict)

    @property
    def kept(self) -> int:
        return self.rows[0] + self.rows[1]


def write_outputs(store: CandidateStore, drop: np.ndarray, workdir: Path, tokenise: Tokenise | None, max_len: int,
                  progress: Callable[[str, int, int | None], None]) -> Written:
    done = Written()
    paths = [workdir / f"{side}.jsonl" for side in SIDES]
    tok_paths = [workdir / f"tokenized-{side}.jsonl" for side in SIDES]
    write_tokens = tokenise is not None and tokenise.cached is None
    files: list[BinaryIO] = [open(p, "wb", buffering=1 << 20) for p in paths]
    tok_files: list[BinaryIO] = [open(p, "wb") for p in tok_paths] if write_tokens else []
    try:
        k = -1
        for i, row in enumerate(store):
            if drop[i]:
                continue
            k += 1
            trained = 0
            if tokenise is not None:
                got = tokenise.row(row.payload, row.line, k)
                if got is None:
                    continue
                tokens, trained = got.tokens, got.trained
                if got.record is not None:
                    tok_files[row.side].write(json.dumps({"line": row.line, **got.record}).encode() + b"\n")
            else:
                tokens = row.estimate
                done.estimated_over += row.estimate > max_len
            done.stats.add(tokens, row.roles, trained)
            done.rows[row.side] += 1
            if row.images:
                done.images += row.images
                done.image_rows += 1
            done.tokens[row.side] += tokens
            files[row.side].write(row.payload + b"\n")
            if done.kept % 4096 == 0:
                progress("write", i, store.count)
    finally:
        for f in (*files, *tok_files):
            f.close()
        if tokenise is not None:
            tokenise.close()
    progress("write", store.count, store.count)
    done.train_path, done.validation_path = (p if n else None for p, n in zip(paths, done.rows, strict=True))
    done.tokenized_paths = {side: p for side, p, n in zip(SIDES, tok_paths, done.rows) if n and write_tokens}
    return done
