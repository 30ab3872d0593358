"""Duplicate passes: exact (per batch, against every earlier row) and near (once, over the store).

Exact: the SHA-256 digest of the normalized role-keyed text, kept as a 64-bit key per row in
a compact set per origin (training file, given validation set); a validation row whose key is
in the training set is an overlap warning. Near: LSH band collisions -> candidate pairs ->
exact Jaccard of char 5-grams (rows read back from the store) -> clusters; every row of a
cluster but its earliest is a near-duplicate.

Rows with images: the exact digest covers the images' bytes (the same text with another image is
another example), and a candidate pair's score is the lower of its text Jaccard and its image
similarity (1 - the largest dHash distance of its image pairs / 64; rows with a different number
of images score 0), so two rows are near-duplicates when their text AND their images are."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...domain.actions import REMOVED
from ...domain.images import image_similarity
from ...domain.hashing import HashSet64
from ...domain.minhash import (LshParams, block_jaccards, candidate_pairs, clusters, exact_jaccard, shingle_sets,
                              verify_pairs)
from ...domain.normal import written_row
from ...domain.report import DuplicateCluster, NearDupReport
from ...domain.schemas import text_messages
from ...domain.text import digest_key, fingerprint
from .findings import Findings
from .rows import Candidate
from .store import CandidateStore, RandomAccess, Stored

EXACT_LINES_LISTED = 20
CLUSTER_LINES_LISTED = 10


class ExactDedup:
    def __init__(self, findings: Findings) -> None:
        self.findings = findings
        self.digests = (HashSet64(), HashSet64())          # per origin: training file, given validation
        self.lines: list[int] = []                         # the first duplicates' lines, for the report

    def run(self, batch: list[Candidate]) -> list[Candidate]:
        first: dict[tuple[int, int], Candidate] = {}
        for p in batch:
            key = (p.origin, digest_key(p.digest))
            if key in first:
                self._duplicate(p)
            else:
                first[key] = p
        fresh: list[Candidate] = []
        for origin in (0, 1):
            group = [p for (o, _), p in first.items() if o == origin]
            if not group:
                continue
            keys = np.array([digest_key(p.digest) for p in group], dtype=np.uint64)
            seen = self.digests[origin].contains(keys)
            self.digests[origin].add(keys[~seen])
            if origin == 1:
                for p in (p for p, o in zip(group, self.digests[0].contains(keys)) if o):
                    self.findings.overlap(p.line, "validation row duplicates a training row")
            for p, dup in zip(group, seen):
                if dup:
                    self._duplicate(p)
                else:
                    fresh.append(p)
        fresh.sort(key=lambda p: p.line)
        return fresh

    def _duplicate(self, p: Candidate) -> None:
        self.findings.counts.exact_duplicates += 1
        self.findings.found("exact_duplicate", p.line, "exact duplicate")
        if len(self.lines) < EXACT_LINES_LISTED:
            self.lines.append(p.line)


@dataclass
class NearDupResult:
    drop: np.ndarray           # per stored row: removed as a near-duplicate
    clusters: int


class NearDedup:
    def __init__(self, lsh: LshParams, findings: Findings, report: NearDupReport, max_clusters: int) -> None:
        self.lsh, self.findings, self.report, self.max_clusters = lsh, findings, report, max_clusters

    def run(self, store: CandidateStore, mapper: Callable[..., Iterable[list[float]]] = map) -> NearDupResult:
        """`mapper` (e.g. the gate's worker pool) may check the candidate pairs' Jaccards in other processes."""
        n = store.count
        drop = np.zeros(n, dtype=bool)
        if store.hasher is None or n < 2:
            return NearDupResult(drop, 0)
        pairs = candidate_pairs(store.band_columns(self.lsh.bands), store.eligible_array())
        self.report.candidate_pairs = int(len(pairs))
        jaccards_of = functools.partial(stored_jaccards, str(store.path), str(store.offsets_path),
                                        threshold=self.report.threshold)
        edges, scores = verify_pairs(pairs, jaccards_of, self.report.threshold, mapper=mapper)
        read = store.reader()
        try:
            origin = store.origin_array()
            same = origin[edges[:, 0]] == origin[edges[:, 1]]
            for a, b in edges[~same].tolist():
                train, val = (a, b) if origin[a] == 0 else (b, a)
                self.findings.overlap(read(val).line, f"validation row is a near-duplicate of training line "
                                      f"{read(train).line}")
            groups = clusters(edges[same])
            partner = _best_partner(edges[same], scores[same])
            for members in groups:
                self.findings.counts.near_duplicates += len(members) - 1
                for i in members[1:]:
                    score, other = partner[i]
                    action = self.findings.found("near_duplicate", read(i).line, "near duplicate",
                                                 duplicate_of=read(other).line, jaccard=round(score, 4),
                                                 cluster_kept_line=read(members[0]).line)
                    drop[i] = action == REMOVED
            self._list_clusters(groups[: self.max_clusters], edges[same], scores[same], read)
        finally:
            read.close()
        return NearDupResult(drop, len(groups))

    def _list_clusters(self, listed: list[list[int]], edges: np.ndarray, scores: np.ndarray,
                       read: RandomAccess) -> None:
        where = {node: k for k, members in enumerate(listed) for node in members}
        best = [0.0] * len(listed)
        for (a, _), score in zip(edges.tolist(), scores.tolist()):
            k = where.get(a)
            if k is not None:
                best[k] = max(best[k], score)
        for k, members in enumerate(listed):
            lines = [read(i).line for i in members[:CLUSTER_LINES_LISTED]]
            self.report.clusters.append(DuplicateCluster(lines[0], lines[1:], len(members), round(best[k], 4)))


def stored_jaccards(path: str, offsets_path: str, part: np.ndarray, threshold: float = 0.0) -> list[float]:
    """`block_jaccards` of pairs of stored rows, read back from the store's files (in any process),
    each capped by the pair's image similarity when a row has images. A pair whose images are
    already below `threshold` is not read as text (its score is the image similarity)."""
    read = RandomAccess(Path(path), np.memmap(offsets_path, dtype=np.int64, mode="r"))
    try:
        rows = {i: read(i) for i in np.unique(part).tolist()}
    finally:
        read.close()
    pairs = part.tolist()
    if not any(row.images for row in rows.values()):
        return block_jaccards(part, lambda ids: shingle_sets([_normalized(rows[i]) for i in ids]))
    sims = [image_similarity(list(rows[a].dhashes), list(rows[b].dhashes)) for a, b in pairs]
    texts = sorted({i for (a, b), sim in zip(pairs, sims) if sim >= threshold for i in (a, b)})
    sets = dict(zip(texts, shingle_sets([_normalized(rows[i]) for i in texts])))
    return [min(exact_jaccard(sets[a], sets[b]), sim) if sim >= threshold else sim
            for (a, b), sim in zip(pairs, sims)]


def _normalized(row: Stored) -> str:
    return fingerprint(text_messages(written_row(json.loads(row.payload))))[0]


def _best_partner(edges: np.ndarray, scores: np.ndarray) -> dict[int, tuple[float, int]]:
    """For every node of the near-duplicate graph: its most similar neighbour (Jaccard, node)."""
    best: dict[int, tuple[float, int]] = {}
    for (a, b), score in zip(edges.tolist(), scores.tolist()):
        if score > best.get(a, (-1.0, 0))[0]:
            best[a] = (score, b)
        if score > best.get(b, (-1.0, 0))[0]:
            best[b] = (score, a)
    return best


