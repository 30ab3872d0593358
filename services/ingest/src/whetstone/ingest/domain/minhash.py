"""Near-duplicate detection: MinHash LSH over character 5-grams, verified by exact Jaccard. Pure.

Signatures are one-permutation MinHash (Li, Owen & Zhang 2012) with optimal
densification (Shrivastava 2017): every shingle is hashed ONCE to 64 bits; the top
log2(K) bits pick one of K bins and each bin keeps its minimum. For bins that are
non-empty in both documents, P[bin values equal] = Jaccard, exactly as for K
independent permutations, but the cost is O(shingles) instead of O(shingles x K).
Empty bins (short texts) borrow the value of a bin chosen by a fixed probe sequence,
so two documents always fill them the same way.

Everything is computed for a whole batch of documents in a few numpy passes: the
batch's code points are concatenated, all 5-gram hashes come from one polynomial
over shifted views, and `np.minimum.at` takes the per-(document, bin) minimum.

LSH: the K values are cut into `bands` bands of `rows` rows; two documents become a
candidate pair when any band hashes equal. Candidates are then verified by the exact
Jaccard of their shingle sets (64-bit shingle hashes), so nothing is removed on an
estimate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .hashing import U64, mix64, mix64_inplace, odd_constants, sorted_unique

SHINGLE = 5
NUM_PERM = 128
_POLY = U64(0x100000001B3)
_MAX = np.iinfo(np.uint64).max
_PROBES = 64
_CHUNK_CHARS = 32_768   # texts are hashed in chunks of about this many characters: arrays stay in cache


def _chunks(texts: Sequence[str], budget: int) -> list[tuple[int, int]]:
    out, lo, size = [], 0, 0
    for i, t in enumerate(texts):
        size += len(t)
        if size >= budget:
            out.append((lo, i + 1))
            lo, size = i + 1, 0
    if lo < len(texts):
        out.append((lo, len(texts)))
    return out


def _codepoints(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    joined = "".join(texts).encode("utf-32-le", "surrogatepass")
    return np.frombuffer(joined, dtype="<u4").astype(U64), lengths


def _short_shingle(text: str) -> int:
    """A text shorter than one shingle is one shingle: itself."""
    h = U64(0)
    cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4").astype(U64)
    with np.errstate(over="ignore"):
        for c in cps:
            h = h * _POLY + c
    return int(mix64(np.array([h], dtype=U64))[0])


def shingle_hashes(texts: Sequence[str], k: int = SHINGLE) -> tuple[np.ndarray, np.ndarray]:
    """64-bit hashes of every character k-gram of every text: (hashes, document index)."""
    cps, lengths = _codepoints(texts)
    n = cps.size - k + 1
    if n > 0:
        h = cps[:n].copy()
        for j in range(1, k):
            h *= _POLY
            h += cps[j:j + n]
        mix64_inplace(h)
        docs = np.repeat(np.arange(len(texts)), lengths)[:n]
        valid = np.ones(n, dtype=bool)
        # the last k-1 positions of every text start a k-gram that runs into the next text
        crossing = (np.cumsum(lengths)[:, None] - np.arange(1, k)[None, :]).ravel()
        valid[crossing[(crossing >= 0) & (crossing < n)]] = False
        hashes, docs = h[valid], docs[valid]
    else:
        hashes, docs = np.zeros(0, U64), np.zeros(0, np.int64)
    short = [i for i, length in enumerate(lengths) if 0 < length < k]
    if short:
        hashes = np.concatenate((hashes, np.array([_short_shingle(texts[i]) for i in short], dtype=U64)))
        docs = np.concatenate((docs, np.array(short, dtype=np.int64)))
    return hashes, docs


def shingle_set(text: str, k: int = SHINGLE) -> np.ndarray:
    """Sorted unique shingle hashes of one text."""
    return sorted_unique(shingle_hashes([text], k)[0])


def shingle_sets(texts: Sequence[str], k: int = SHINGLE) -> list[np.ndarray]:
    """`shingle_set` of each text, hashed a few texts at a time (arrays stay small)."""
    out: list[np.ndarray] = []
    for lo, hi in _chunks(texts, _CHUNK_CHARS):
        hashes, docs = shingle_hashes(texts[lo:hi], k)
        if docs.size and (docs[1:] < docs[:-1]).any():     # texts shorter than k come last: put them in place
            order = np.argsort(docs, kind="stable")
            hashes, docs = hashes[order], docs[order]
        bounds = np.searchsorted(docs, np.arange(hi - lo + 1))
        out += [sorted_unique(hashes[bounds[i]:bounds[i + 1]]) for i in range(hi - lo)]
    return out


def exact_jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard of two sorted unique arrays."""
    if a.size == 0 and b.size == 0:
        return 1.0
    if a.size > b.size:
        a, b = b, a
    if a.size == 0:
        return 0.0
    at = np.searchsorted(b, a)           # where each of the smaller set's values would be in the larger
    at[at == b.size] = 0
    inter = int(np.count_nonzero(b[at] == a))
    return inter / (a.size + b.size - inter)


@dataclass(frozen=True)
class LshParams:
    num_perm: int
    bands: int
    rows: int

    @classmethod
    def for_threshold(cls, threshold: float, num_perm: int = NUM_PERM, max_miss: float = 1e-3) -> LshParams:
        """The most selective banding whose chance of missing a pair AT the threshold is <= max_miss."""
        if num_perm & (num_perm - 1) or not 0 < threshold <= 1:
            raise ValueError("num_perm must be a power of two and 0 < threshold <= 1")
        best = cls(num_perm, num_perm, 1)
        for rows in range(1, num_perm + 1):
            bands = num_perm // rows
            banding = cls(num_perm, bands, rows)
            if 1 - banding.candidate_probability(threshold) <= max_miss:
                best = banding
        return best

    def candidate_probability(self, jaccard: float) -> float:
        return 1 - (1 - jaccard**self.rows) ** self.bands


class MinHasher:
    """Batch one-permutation MinHash signatures and LSH band hashes."""

    def __init__(self, params: LshParams, k: int = SHINGLE) -> None:
        self.params, self.k = params, k
        self.bin_shift = U64(64 - (params.num_perm.bit_length() - 1))
        rng = np.random.default_rng(0x5EED)
        self.probes = rng.integers(0, params.num_perm, size=(params.num_perm, _PROBES))
        self.row_mult = odd_constants(params.rows, seed=17)

    def signatures(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(signatures [docs, num_perm] uint64, shingle count per doc)."""
        K = self.params.num_perm
        sig: np.ndarray = np.full(len(texts) * K, _MAX, dtype=U64)
        counts = np.zeros(len(texts), dtype=np.int64)
        for lo, hi in _chunks(texts, _CHUNK_CHARS):
            hashes, docs = shingle_hashes(texts[lo:hi], self.k)
            if hashes.size:
                docs += lo
                np.minimum.at(sig, docs * K + (hashes >> self.bin_shift).astype(np.int64), hashes)
                counts[lo:hi] = np.bincount(docs - lo, minlength=hi - lo)
        sig = sig.reshape(len(texts), K)
        for i in np.flatnonzero((sig == _MAX).any(axis=1) & (counts > 0)):
            self._densify(sig[i])
        return sig, counts

    def _densify(self, row: np.ndarray) -> None:
        original = row.copy()
        empty = np.flatnonzero(original == _MAX)
        for attempt in range(_PROBES):
            if not empty.size:
                return
            donor = original[self.probes[empty, attempt]]
            ok = donor != _MAX
            row[empty[ok]] = donor[ok]
            empty = empty[~ok]
        nonempty = original[original != _MAX]
        row[empty] = nonempty.min()  # practically unreachable: 64 unlucky probes in a row

    def band_hashes(self, sig: np.ndarray) -> np.ndarray:
        """[docs, bands] uint64: one hash per band of `rows` signature values."""
        p = self.params
        used = sig[:, : p.bands * p.rows].reshape(sig.shape[0], p.bands, p.rows)
        return mix64((used * self.row_mult).sum(axis=2, dtype=U64))


def candidate_pairs(band_columns: Iterable[np.ndarray], eligible: np.ndarray) -> np.ndarray:
    """Pairs (i < j) of eligible documents that share a band hash, as an [m, 2] int64 array.

    Inside a bucket every member is paired with the bucket's first (earliest) member and
    with its predecessor: at most two pairs per member and band, so a bucket of a
    thousand copies costs thousands of checks, not half a million."""
    idx = np.flatnonzero(eligible)
    found = []
    for column in band_columns:
        keys = column[idx]
        order = np.argsort(keys, kind="stable")
        sk, si = keys[order], idx[order]
        same = sk[1:] == sk[:-1]
        if not same.any():
            continue
        new_run = np.concatenate(([True], ~same))
        run_start = np.flatnonzero(new_run)
        heads = si[run_start[np.cumsum(new_run) - 1]]
        members = np.flatnonzero(~new_run)
        found.append(np.stack((heads[members], si[members]), axis=1))
        found.append(np.stack((si[members - 1], si[members]), axis=1))
    if not found:
        return np.zeros((0, 2), dtype=np.int64)
    pairs = np.concatenate(found)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    pairs.sort(axis=1)
    return np.unique(pairs, axis=0)


def block_jaccards(part: np.ndarray, shingles_of: Callable[[list[int]], list[np.ndarray]]) -> list[float]:
    """Exact Jaccard of each pair of `part`; `shingles_of` gives the shingle sets of a list of rows at once."""
    ids = np.unique(part).tolist()
    sets = dict(zip(ids, shingles_of(ids)))
    return [exact_jaccard(sets[a], sets[b]) for a, b in part.tolist()]


def verify_pairs(pairs: np.ndarray, jaccards_of: Callable[[np.ndarray], list[float]], threshold: float,
                 block: int = 512, mapper: Callable[..., Iterable[list[float]]] = map) -> tuple[np.ndarray, np.ndarray]:
    """Exact Jaccard of each candidate pair: (pairs with Jaccard >= threshold, their Jaccards).
    Pairs are checked `block` at a time (`jaccards_of`, e.g. `block_jaccards` over the stored rows), so
    memory holds the sets of at most 2 x `block` rows; `mapper` may spread the blocks over processes
    (results come back in order)."""
    parts = [pairs[lo:lo + block] for lo in range(0, len(pairs), block)]
    keep, scores = [], []
    for part, found in zip(parts, mapper(jaccards_of, parts)):
        for (a, b), j in zip(part.tolist(), found):
            if j >= threshold:
                keep.append((a, b))
                scores.append(j)
    return np.array(keep, dtype=np.int64).reshape(-1, 2), np.array(scores, dtype=float)


def clusters(edges: np.ndarray) -> list[list[int]]:
    """Connected components (size >= 2) of the verified near-duplicate graph, members sorted."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        root = x
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(x, x) != root:
            parent[x], x = root, parent[x]
        return root

    for a, b in edges.tolist():
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, list[int]] = {}
    for node in {int(x) for x in edges.ravel().tolist()}:
        groups.setdefault(find(node), []).append(node)
    return sorted((sorted(g) for g in groups.values()), key=lambda g: g[0])
