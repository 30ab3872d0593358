"""Tokenise pass: a stored row -> its token counts (and input_ids/labels) with the base model's
tokenizer, under the over-length policy; or the counts of an earlier run when they apply."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from whetstone.contracts.dataset_stats import MaskPreview, TokenizationSummary

from ...adapters.tokenizer import ImagesUnsupported, Tokenized, ToolsUnsupported
from ...domain.actions import keeps_row
from ...domain.normal import NormalRow, written_row
from .findings import Findings

PREVIEWS = 3


class TokenizerPort(Protocol):
    ref: str
    hash: str

    def max_seq_len(self, policy_value: int | None) -> int: ...
    def tokenize(self, out: NormalRow, max_len: int | None = None) -> Tokenized: ...
    def preview(self, out: NormalRow) -> str: ...


@dataclass
class TokenCounts:
    """Per-row token counts of an earlier tokenization (the tokenized cache's `lengths.tsv`).

    Used instead of tokenizing again only when it covers exactly the rows about to be
    tokenized, in order, under the same tokenizer and length policy (`fingerprint`)."""

    fingerprint: str
    lines: np.ndarray
    tokens: np.ndarray
    longest: np.ndarray
    trained: np.ndarray

    @classmethod
    def read(cls, path: Path, fingerprint: str) -> TokenCounts:
        table = np.loadtxt(path, dtype=np.int64, delimiter="\t", ndmin=2)
        table = table.reshape(-1, 4)
        return cls(fingerprint, table[:, 0], table[:, 1], table[:, 2], table[:, 3])

    def applies_to(self, fingerprint: str, lines: np.ndarray) -> bool:
        return self.fingerprint == fingerprint and np.array_equal(self.lines, lines)


def token_fingerprint(tokenizer_hash: str, pii: str, max_len: int, over_length: str) -> str:
    """What decides a row's token counts besides its line: the tokenizer, redaction, the length rule."""
    return hashlib.sha256(f"{tokenizer_hash}|pii={pii}|max_len={max_len}|over_length={over_length}".encode()
                          ).hexdigest()


@dataclass
class Tokenised:
    tokens: int
    trained: int
    record: dict[str, list[int]] | None      # input_ids/labels; None when the counts came from the cache


class Tokenise:
    """Tokenizes the kept rows one by one, counting over-length rows and keeping a few mask previews;
    `section()` is the report's tokenization section with those figures."""

    def __init__(self, tokenizer: TokenizerPort, findings: Findings, settings: TokenizationSummary,
                 cached: TokenCounts | None, lengths_path: Path) -> None:
        self.tok, self.findings, self.settings, self.cached = tokenizer, findings, settings, cached
        self.lengths_path = lengths_path
        self._lengths = open(lengths_path, "wb")
        self.over_length = self.truncated = self.dropped = 0
        self.previews: list[MaskPreview] = []

    def section(self) -> TokenizationSummary:
        return self.settings.model_copy(update={"over_length": self.over_length, "truncated": self.truncated,
                                                "dropped": self.dropped, "mask_preview": list(self.previews)})

    def row(self, payload: bytes, line: int, k: int) -> Tokenised | None:
        """The `k`-th kept row (index into the cached counts); None when dropped or rejected."""
        max_len, cached = self.settings.max_seq_len, self.cached
        out: NormalRow | None = None
        try:
            if cached:
                tokens, longest, trained = int(cached.tokens[k]), int(cached.longest[k]), int(cached.trained[k])
                record = None
            else:
                out = written_row(json.loads(payload))
                t = self.tok.tokenize(out)
                tokens, longest, trained, record = t.tokens, t.longest, t.trained, t.record
            if longest > max_len:
                self.over_length += 1
                action = self.findings.found("over_length", line, f"{longest} tokens > max_seq_len {max_len}",
                                             verb="dropped", tokens=longest, max_seq_len=max_len,
                                             policy=self.settings.over_length_policy)
                if not keeps_row(action):
                    if action == "removed":
                        self.dropped += 1
                        self._lengths.write(b"%d\t%d\t%d\t%d\n" % (line, tokens, longest, trained))
                    return None
                self.truncated += 1
                if out is not None:
                    t = self.tok.tokenize(out, max_len)
                    tokens, trained, record = t.tokens, t.trained, t.record
            if len(self.previews) < PREVIEWS:
                self.previews.append(MaskPreview(line=line, rendered=self.tok.preview(
                    out or written_row(json.loads(payload)))[:4000]))
        except ToolsUnsupported as exc:
            self.findings.log.error("tools_unsupported", str(exc), line)
            return None
        except ImagesUnsupported as exc:
            self.findings.log.error("images_unsupported_by_base", str(exc), line)
            return None
        except Exception as exc:  # the template's own errors (jinja, ChatFormatError, ...)
            self.findings.log.error("template_error", f"the chat template cannot render this row: "
                                    f"{type(exc).__name__}: {str(exc)[:200]}", line)
            return None
        self._lengths.write(b"%d\t%d\t%d\t%d\n" % (line, tokens, longest, trained))
        return Tokenised(tokens, trained, record)

    def close(self) -> None:
        self._lengths.close()
