"""64-bit hashing helpers and a compact set of 64-bit keys, all vectorised with numpy. Pure.

`HashSet64` is an open-addressing (linear probing) table in one numpy array: 8 bytes per
slot at a load factor between 1/4 and 1/2, i.e. 16 to 32 bytes per key (plus a 1-byte-
per-2-slots bitmap) and no Python object per key. It holds the exact-duplicate digests of a streamed dataset and the 13-gram
hashes of the contamination reference sets.
"""

from __future__ import annotations

import numpy as np

U64 = np.uint64
_EMPTY_SUBSTITUTE = U64(0x9E3779B97F4A7C15)  # key 0 marks an empty slot; store 0 as this


def mix64(h: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer on a uint64 array (wrapping arithmetic): a good avalanche mix."""
    h = h ^ (h >> U64(30))
    h = h * U64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> U64(27))
    h = h * U64(0x94D049BB133111EB)
    mixed: np.ndarray = h ^ (h >> U64(31))
    return mixed


def mix64_inplace(h: np.ndarray) -> np.ndarray:
    """mix64 without allocating new full-size results (for large arrays)."""
    h ^= h >> U64(30)
    h *= U64(0xBF58476D1CE4E5B9)
    h ^= h >> U64(27)
    h *= U64(0x94D049BB133111EB)
    h ^= h >> U64(31)
    return h


def sorted_unique(a: np.ndarray) -> np.ndarray:
    """np.unique for 1-D integer arrays via one sort (faster than numpy's hash-based unique here)."""
    s = np.sort(a)
    if s.size < 2:
        return s
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def odd_constants(count: int, seed: int) -> np.ndarray:
    """`count` fixed odd 64-bit multipliers (deterministic)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**63, size=count, dtype=np.int64).astype(U64) * U64(2) + U64(1)


class HashSet64:
    """A set of uint64 hash keys; `contains` and `add` take whole arrays.

    Keys must already be hashes (uniform bits): the home slot is taken from their low
    bits. A bitmap of 4 bits per slot (8 per key), indexed by the keys' high bits,
    answers most negative lookups with one access to a small array, before the table
    is probed at all."""

    def __init__(self, expected: int = 0) -> None:
        capacity = 1024
        while capacity < 2 * expected:
            capacity *= 2
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        self.table = np.zeros(capacity, dtype=U64)
        self.bits = np.zeros(capacity // 2, dtype=np.uint8)
        self.bit_shift = U64(64 - (capacity * 4).bit_length() + 1)
        self.size = 0

    @property
    def nbytes(self) -> int:
        return self.table.nbytes + self.bits.nbytes

    def __len__(self) -> int:
        return self.size

    @staticmethod
    def _clean(keys: np.ndarray) -> np.ndarray:
        keys = np.asarray(keys, dtype=U64)
        return np.where(keys == 0, _EMPTY_SUBSTITUTE, keys)

    def _bit(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        index = (keys >> self.bit_shift).astype(np.int64)
        return index >> 3, (1 << (index & 7)).astype(np.uint8)

    def _maybe(self, keys: np.ndarray) -> np.ndarray:
        byte, mask = self._bit(keys)
        found: np.ndarray = (self.bits[byte] & mask) != 0
        return found

    def contains(self, keys: np.ndarray) -> np.ndarray:
        keys = self._clean(keys)
        found = np.zeros(keys.size, dtype=bool)
        pending = np.flatnonzero(self._maybe(keys))
        mask = self.table.size - 1
        pos = np.zeros(keys.size, dtype=np.int64)
        pos[pending] = (keys[pending] & U64(mask)).astype(np.int64)
        while pending.size:
            seen = self.table[pos[pending]]
            want = keys[pending]
            hit = seen == want
            found[pending[hit]] = True
            go_on = ~hit & (seen != 0)
            pending = pending[go_on]
            pos[pending] = (pos[pending] + 1) & mask
        return found

    def add(self, keys: np.ndarray) -> int:
        """Insert keys (duplicates and present keys allowed); returns how many were new."""
        keys = sorted_unique(self._clean(keys))
        if (self.size + keys.size) * 2 > self.table.size:
            self._grow(self.size + keys.size)
        before = self.size
        mask = self.table.size - 1
        pos = (keys & U64(mask)).astype(np.int64)
        pending = np.arange(keys.size)
        while pending.size:
            slots = pos[pending]
            seen = self.table[slots]
            done = seen == keys[pending]
            empty = np.flatnonzero(seen == 0)
            if empty.size:  # the first claimant of each empty slot takes it
                _, first = np.unique(slots[empty], return_index=True)
                winners = empty[first]
                self.table[slots[winners]] = keys[pending[winners]]
                self.size += winners.size
                done[winners] = True
            pending = pending[~done]
            pos[pending] = (pos[pending] + 1) & mask
        byte, bit = self._bit(keys)
        np.bitwise_or.at(self.bits, byte, bit)
        return self.size - before

    def _grow(self, needed: int) -> None:
        old = self.table[self.table != 0]
        capacity = self.table.size
        while capacity < 2 * needed:
            capacity *= 2
        self._allocate(capacity)
        if old.size:
            self.add(old)
