"""Benchmark contamination: word 13-gram overlap with reference (eval/test) sets. Pure.

Words are maximal runs of lowercase letters, digits and non-ASCII characters
(punctuation and whitespace separate words), so "The dog." and "the dog" match.
Each word is hashed once from its first 24 bytes, each 13-gram is a polynomial over 13
word hashes, then mixed. A reference set is a `HashSet64` of its 13-gram hashes (16 to 32
bytes per 13-gram); a batch of examples is looked up in a handful of vectorised probes. An example is contaminated when MORE
than `threshold` (default 0.5) of its 13-grams occur in a reference set.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .hashing import U64, HashSet64, mix64_inplace

NGRAM = 13
WORD_BYTES = 24          # words are compared on their first 24 bytes
_BOUNDARY = b"\x01"      # a word no text can contain: separates the texts of a batch
_SEPARATE = bytes(c if (48 <= c <= 57 or 97 <= c <= 122 or c >= 128 or c == 1) else 32 for c in range(256))
_WORD_TABLE = bytes(c + 32 if 65 <= c <= 90 else _SEPARATE[c] for c in range(256))
_WINDOW_BYTES = 1 << 18     # bytes hashed at a time (word hashes)
_CACHED_POWERS = 1 << 20    # power tables up to this size are kept between batches
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

    The batch is joined with a boundary word and lowercased by one `bytes.translate`
    (C speed); numpy finds the words (runs of non-space bytes) and hashes each from its
    first 24 bytes without one Python object per word: a word's bytes b[s..e) give
    sum_t b[t] * C^(t-s), read off one prefix sum P[j] = sum_{t<j} b[t] * C^t as
    (P[e] - P[s]) * C^-s, then mixed (splitmix64). The n-gram hash is the polynomial
    sum_k w[i+k] * B^(n-1-k) (mod 2^64), computed for all
    positions at once from one prefix sum: with B odd, B is invertible mod 2^64, so
    hash(i) = B^(i+n-1) * (P[i+n] - P[i]) where P[j] = sum_{t<j} w[t] * B^-t. The sum
    is then mixed (splitmix64)."""

    BASE = 0x9E3779B97F4A7C15 | 1
    BYTE_BASE = 0xC2B2AE3D27D4EB4F          # odd: invertible mod 2^64

    def __init__(self, n: int = NGRAM) -> None:
        self.n = n
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def __getstate__(self) -> dict[str, int]:
        return {"n": self.n}                # the power tables are rebuilt on demand (not pickled to workers)

    def __setstate__(self, state: dict[str, int]) -> None:
        NgramHasher.__init__(self, state["n"])

    def _powers(self, base: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        """(base^t, base^-t) for t < size, mod 2^64; tables up to `_CACHED_POWERS` are kept."""
        pw, inv = self._cache.get(base, (np.ones(1, dtype=U64), np.ones(1, dtype=U64)))
        if pw.size < size:
            size = max(size, min(2 * pw.size, _CACHED_POWERS))
            pw = np.full(size, base, dtype=U64)
            inv = np.full(size, pow(base, -1, 2**64), dtype=U64)
            pw[0] = inv[0] = 1
            np.cumprod(pw, out=pw)
            np.cumprod(inv, out=inv)
            if size <= _CACHED_POWERS:
                self._cache[base] = pw, inv
        return pw, inv

    def word_hashes(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(hash of every word, its document index). The bytes are hashed in windows of about
        `_WINDOW_BYTES` cut at a separator (a word's hash does not depend on its position), so the
        temporary arrays stay small whatever the batch or a single text's size."""
        joined = (b" " + _BOUNDARY + b" ").join(_utf8(t).translate(_CLEAN) for t in texts).translate(_WORD_TABLE)
        hashes, boundaries = [], []
        lo = 0
        while lo < len(joined):
            hi = len(joined) if len(joined) - lo <= _WINDOW_BYTES else joined.rfind(b" ", lo, lo + _WINDOW_BYTES)
            if hi <= lo:                    # no separator in the window: one very long word
                hi = joined.find(b" ", lo + _WINDOW_BYTES)
                hi = len(joined) if hi < 0 else hi
            h, boundary = self._window_hashes(np.frombuffer(joined, dtype=np.uint8, count=hi - lo, offset=lo))
            hashes.append(h)
            boundaries.append(boundary)
            lo = hi
        if not hashes:
            return np.zeros(0, U64), np.zeros(0, np.int64)
        h, boundary = np.concatenate(hashes), np.concatenate(boundaries)
        keep = ~boundary
        return h[keep], np.cumsum(boundary)[keep]

    def _window_hashes(self, buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mixed hash of every word of `buf`, whether it is the boundary word)."""
        edge = np.zeros(buf.size + 2, dtype=np.int8)
        np.not_equal(buf, 32, out=edge[1:-1].view(bool))      # after the translation only 32 separates words
        step = np.diff(edge)
        starts, ends = np.flatnonzero(step == 1), np.flatnonzero(step == -1)
        np.minimum(ends, starts + WORD_BYTES, out=ends)
        powers, inverses = self._powers(self.BYTE_BASE, buf.size)
        prefix = np.zeros(buf.size + 1, dtype=U64)
        np.cumsum(buf * powers[:buf.size], out=prefix[1:])
        h = prefix[ends] - prefix[starts]
        h *= inverses[starts]
        boundary = (ends - starts == 1) & (buf[starts] == 1)   # only the boundary word is the byte 1 alone
        return mix64_inplace(h), boundary

    def batch(self, texts: Sequence[str], words: tuple[np.ndarray, np.ndarray] | None = None) -> NgramBatch:
        """Every n-gram of the texts; `words`: their `word_hashes`, when already computed."""
        n = self.n
        word_hash, word_doc = words if words is not None else self.word_hashes(texts)
        total = word_hash.size
        m = total - n + 1
        if m <= 0:
            return NgramBatch(np.zeros(0, U64), np.zeros(0, np.int64), np.zeros(len(texts), np.int64))
        powers, inverses = self._powers(self.BASE, total)
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

    def match(self, texts: Sequence[str], words: tuple[np.ndarray, np.ndarray] | None = None
              ) -> tuple[np.ndarray, list[str | None]]:
        """Per text: the fraction of its 13-grams found in any set, and the set matching most."""
        b = self.hasher.batch(texts, words)
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
