"""Benchmark contamination: word 13-gram overlap with reference (eval/test) sets. Pure.

Words are maximal runs of lowercase letters, digits and non-ASCII characters
(punctuation and whitespace separate words), so "The dog." and "the dog" match.
Each word is hashed once (Python's bytes hash: fast and consistent within a process;
an index is always built in the process that uses it), each 13-gram is a polynomial
over 13 word hashes computed with 13 shifted numpy views, then mixed. A reference set
is a `HashSet64` of its 13-gram hashes (16 to 32 bytes per 13-gram); a batch of examples
is looked up in a handful of vectorised probes. An example is contaminated when MORE
than `threshold` (default 0.5) of its 13-grams occur in a reference set.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .hashing import U64, HashSet64, mix64_inplace, odd_constants

NGRAM = 13
WORD_BYTES = 24          # words are compared on their first 24 bytes
_BOUNDARY = b"\x01"      # a word no text can contain: separates the texts of a batch
_SEPARATE = bytes(c if (48 <= c <= 57 or 97 <= c <= 122 or c >= 128 or c == 1) else 32 for c in range(256))
_WORD_TABLE = bytes(c + 32 if 65 <= c <= 90 else _SEPARATE[c] for c in range(256))
_CLEAN = bytes(32 if c == 1 else c for c in range(256))


def _utf8(text: str) -> bytes:
    return (text if text.isascii() else text.lower()).encode("utf-8", "surrogatepass")


def words(text: str) -> list[bytes]:
    return _utf8(text).translate(_WORD_TABLE).translate(_CLEAN).split()


@dataclass
class NgramBatch:
    hashes: np.ndarray   # uint64, every valid 13-gram of every document
    docs: np.ndarray     # int64 document index of each hash
    counts: np.ndarray   # 13-grams per document


class NgramHasher:
    """Word n-gram hashes of a batch of texts in one pass.

    The batch is joined with a boundary word, lowercased and split into words by one
    `bytes.translate` + `split` (C speed); numpy turns the word list into fixed-width
    24-byte records and hashes each word linearly from its three 64-bit lanes. The
    n-gram hash is the polynomial sum_k w[i+k] * B^(n-1-k) (mod 2^64), computed for all
    positions at once from one prefix sum: with B odd, B is invertible mod 2^64, so
    hash(i) = B^(i+n-1) * (P[i+n] - P[i]) where P[j] = sum_{t<j} w[t] * B^-t. The sum
    is then mixed (splitmix64)."""

    BASE = 0x9E3779B97F4A7C15 | 1

    def __init__(self, n: int = NGRAM) -> None:
        self.n = n
        self.lane = odd_constants(WORD_BYTES // 8, seed=2424)
        self._pow = np.ones(1, dtype=U64)
        self._inv = np.ones(1, dtype=U64)

    def _powers(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        if self._pow.size < size:
            size = max(size, 2 * self._pow.size)
            inverse = pow(self.BASE, -1, 2**64)
            self._pow = np.full(size, self.BASE, dtype=U64)
            self._inv = np.full(size, inverse, dtype=U64)
            self._pow[0] = self._inv[0] = 1
            np.cumprod(self._pow, out=self._pow)
            np.cumprod(self._inv, out=self._inv)
        return self._pow, self._inv

    def word_hashes(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(hash of every word, its document index)."""
        joined = (b" " + _BOUNDARY + b" ").join(_utf8(t).translate(_CLEAN) for t in texts)
        tokens = joined.translate(_WORD_TABLE).split()
        if not tokens:
            return np.zeros(0, U64), np.zeros(0, np.int64)
        lanes = np.array(tokens, dtype=f"S{WORD_BYTES}").view(U64).reshape(len(tokens), -1).T
        boundary = lanes[0] == 1          # only the boundary word starts with byte 1 followed by NULs
        h = lanes[0] * self.lane[0]
        for j in range(1, lanes.shape[0]):
            h += lanes[j] * self.lane[j]
        keep = ~boundary
        return h[keep], np.cumsum(boundary)[keep]

    def batch(self, texts: Sequence[str]) -> NgramBatch:
        n = self.n
        word_hash, word_doc = self.word_hashes(texts)
        total = word_hash.size
        m = total - n + 1
        if m <= 0:
            return NgramBatch(np.zeros(0, U64), np.zeros(0, np.int64), np.zeros(len(texts), np.int64))
        powers, inverses = self._powers(total)
        prefix = np.zeros(total + 1, dtype=U64)
        np.cumsum(word_hash * inverses[:total], out=prefix[1:])
        h = prefix[n:] - prefix[:m]
        h *= powers[n - 1:total]
        valid = word_doc[:m] == word_doc[n - 1:]          # the n-gram's first and last word: same text
        docs = word_doc[:m][valid]
        return NgramBatch(mix64_inplace(h[valid]), docs, np.bincount(docs, minlength=len(texts)))


@dataclass
class ReferenceSet:
    name: str
    grams: HashSet64
    items: int = 0


@dataclass
class ReferenceIndex:
    """Named reference sets (benchmarks, a tenant's own eval sets)."""

    hasher: NgramHasher = field(default_factory=NgramHasher)
    sets: dict[str, ReferenceSet] = field(default_factory=dict)

    def add(self, name: str, texts: Iterable[str], batch: int = 512) -> None:
        ref = self.sets.setdefault(name, ReferenceSet(name, HashSet64()))
        chunk: list[str] = []
        for text in texts:
            chunk.append(text)
            if len(chunk) >= batch:
                self._add_chunk(ref, chunk)
                chunk = []
        if chunk:
            self._add_chunk(ref, chunk)

    def _add_chunk(self, ref: ReferenceSet, chunk: list[str]) -> None:
        ref.grams.add(self.hasher.batch(chunk).hashes)
        ref.items += len(chunk)

    def __bool__(self) -> bool:
        return any(s.items for s in self.sets.values())

    @property
    def nbytes(self) -> int:
        return sum(s.grams.nbytes for s in self.sets.values())

    def describe(self) -> dict[str, dict[str, int]]:
        return {s.name: {"items": s.items, "ngrams": len(s.grams)} for s in self.sets.values()}

    def match(self, texts: Sequence[str]) -> tuple[np.ndarray, list[str | None]]:
        """Per text: the fraction of its 13-grams found in any set, and the set matching most."""
        b = self.hasher.batch(texts)
        hit_any = np.zeros(b.hashes.size, dtype=bool)
        best_hits = np.zeros(len(texts), dtype=np.int64)
        best: list[str | None] = [None] * len(texts)
        for ref in self.sets.values():
            hit = ref.grams.contains(b.hashes)
            hit_any |= hit
            per_doc = np.bincount(b.docs[hit], minlength=len(texts))
            for i in np.flatnonzero(per_doc > best_hits):
                best[i] = ref.name
            best_hits = np.maximum(best_hits, per_doc)
        hits = np.bincount(b.docs[hit_any], minlength=len(texts))
        return hits / np.maximum(b.counts, 1), best


def is_contaminated(fraction: float, threshold: float) -> bool:
    return fraction > threshold
