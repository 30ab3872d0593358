"""The surviving rows of pass 1, on local disk: one record per row (line, origin, side, length
estimate, image count, the images' dHashes, role counts, the output row), MinHash band hashes, byte offsets and line numbers.
Only 2 bytes per row (origin, LSH eligibility) stay in memory."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...domain.minhash import MinHasher
from ...domain.images import RowImages
from .prepare import Candidate

ROLE_FIELDS = ("system", "user", "assistant", "tool", "text")
_HEAD = b"\t".join([b"%d"] * 5 + [b"%s"] + [b"%d"] * len(ROLE_FIELDS)) + b"\t"
_FIELDS = 6 + len(ROLE_FIELDS)


@dataclass
class Stored:
    """One stored row as pass 2 reads it back."""

    line: int
    side: int                  # 0: train, 1: validation
    estimate: int              # tokens estimated from characters (no tokenizer)
    roles: dict[str, int]
    payload: bytes             # the output row, JSON
    images: int = 0
    dhashes: tuple[int, ...] = ()   # the images' 64-bit difference hashes, in order (near duplicates)


class CandidateStore:
    def __init__(self, workdir: Path, hasher: MinHasher | None) -> None:
        self.path, self.bands_path = workdir / "candidates.tsv", workdir / "bands.u64"
        self.offsets_path, self.lines_path = workdir / "offsets.i64", workdir / "lines.i64"
        self.hasher = hasher
        self.count = 0
        self.origins: list[np.ndarray] = []
        self.eligible: list[np.ndarray] = []
        paths = (self.path, self.bands_path, self.offsets_path, self.lines_path)
        self._files = [open(p, "wb", buffering=1 << 20) for p in paths]     # written a batch at a time

    def append(self, rows: list[Candidate], sides: list[int]) -> None:
        if not rows:
            return
        cand, bands, offsets_file, lines_file = self._files
        if self.hasher is not None:          # band hashes computed by `prepare`
            stacked = [p.bands for p in rows if p.bands is not None]
            assert len(stacked) == len(rows)
            bands.write(np.stack(stacked).tobytes())
            self.eligible.append(np.array([p.shingles > 0 for p in rows], dtype=bool))
        records = [_HEAD % (p.line, p.origin, side, p.estimate, p.images.count if p.images else 0,
                            _hashes(p.images), *[p.roles.get(r, 0) for r in ROLE_FIELDS])
                   + p.payload + b"\n" for p, side in zip(rows, sides)]
        sizes = np.fromiter(map(len, records), dtype=np.int64, count=len(records))
        offsets = np.empty(len(rows), dtype=np.int64)      # each record's start: one write for the batch
        offsets[0] = cand.tell()
        np.cumsum(sizes[:-1], out=offsets[1:])
        offsets[1:] += offsets[0]
        cand.write(b"".join(records))
        offsets_file.write(offsets.tobytes())
        lines_file.write(np.array([p.line for p in rows], dtype=np.int64).tobytes())
        self.origins.append(np.array([p.origin for p in rows], dtype=np.int8))
        self.count += len(rows)

    def close_writing(self) -> None:
        for f in self._files:
            f.close()

    # ------------------------------------------------------------------ reading back

    def origin_array(self) -> np.ndarray:
        return np.concatenate(self.origins) if self.origins else np.zeros(0, np.int8)

    def eligible_array(self) -> np.ndarray:
        return np.concatenate(self.eligible) if self.eligible else np.zeros(0, bool)

    def lines(self) -> np.ndarray:
        return np.fromfile(self.lines_path, dtype=np.int64) if self.count else np.zeros(0, np.int64)

    def band_columns(self, bands: int) -> Iterator[np.ndarray]:
        table = np.memmap(self.bands_path, dtype=np.uint64, mode="r", shape=(self.count, bands))
        for b in range(bands):
            yield np.array(table[:, b])

    def __iter__(self) -> Iterator[Stored]:
        with open(self.path, "rb", buffering=1 << 20) as f:
            for record in f:
                yield _parse(record)

    def reader(self) -> RandomAccess:
        return RandomAccess(self.path, np.fromfile(self.offsets_path, dtype=np.int64))

    def remove_files(self) -> None:
        for p in (self.path, self.bands_path, self.offsets_path, self.lines_path):
            p.unlink(missing_ok=True)


def _parse(record: bytes) -> Stored:
    parts = record.split(b"\t", _FIELDS)
    roles = {r: int(parts[6 + j]) for j, r in enumerate(ROLE_FIELDS) if parts[6 + j] != b"0"}
    images = int(parts[4])
    dhashes = tuple(int(h, 16) for h in parts[5].split(b",")) if images else ()
    return Stored(int(parts[0]), int(parts[2]), int(parts[3]), roles, parts[_FIELDS].rstrip(b"\n"), images, dhashes)


def _hashes(images: RowImages | None) -> bytes:
    return b",".join(b"%x" % f.dhash for f in images.facts) if images else b"-"


class RandomAccess:
    """Stored rows by index (near-duplicate verification reads only the candidate pairs)."""

    def __init__(self, path: Path, offsets: np.ndarray) -> None:
        self.f, self.offsets = open(path, "rb"), offsets

    def __call__(self, i: int) -> Stored:
        self.f.seek(int(self.offsets[i]))
        return _parse(self.f.readline())

    def close(self) -> None:
        self.f.close()
