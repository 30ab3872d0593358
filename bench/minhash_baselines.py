"""MinHash against the strongest baselines, on the same documents and permutations (part of
`bench/ingest.py`): ours, rensa (Rust) and datasketch's bulk path; docs per CPU-second and the
near-duplicate recall / precision of each LSH's candidate pairs."""

from __future__ import annotations

import time

import numpy as np
from whetstone.ingest.domain.minhash import (
    LshParams,
    MinHasher,
    candidate_pairs,
    shingle_hashes,
)
from whetstone.ingest.domain.text import normalize_text

THRESHOLD = 0.9

ROUNDS = 3


def best_rate(runs: list[tuple[int, float]]) -> float:
    """Docs/s of the fastest round (rounds of both methods alternate, so load bursts hit both alike)."""
    return max(n / seconds for n, seconds in runs)


def timed(fn, n: int) -> tuple[int, float]:
    """(n, CPU seconds of this process, all its threads): on a shared machine wall-clock rates say
    more about the neighbours than about the code."""
    t = time.process_time()
    fn()
    return n, time.process_time() - t


def char_shingles(text: str, k: int = 5) -> list[str]:
    """The gate's shingles as strings (char 5-grams of the normalized text; a shorter text is one shingle)."""
    return [text[i:i + k] for i in range(max(1, len(text) - k + 1))] if text else []


def shingle_jaccard(a: str, b: str) -> float:
    sa, sb = set(char_shingles(a)), set(char_shingles(b))
    return len(sa & sb) / max(1, len(sa | sb))


def lsh_pairs(buckets_per_doc: list[list[int]]) -> set[tuple[int, int]]:
    return {(min(i, j), max(i, j)) for i, found in enumerate(buckets_per_doc) for j in found if i != j}


def bench_minhash(texts: list[str], truth_pairs: list[tuple[int, int]]) -> dict:
    """Ours, rensa (RMinHash + RMinHashLSH) and datasketch's bulk path (MinHash.bulk -> LeanMinHash ->
    MinHashLSH) on the same normalized documents, 128 permutations and the same LSH banding: docs/s
    (text -> signature, shingling included; ours also gives the band hashes) and near-duplicate
    recall / precision of each LSH's candidate pairs against the pairs whose exact Jaccard is >= 0.9."""
    import rensa
    from datasketch import LeanMinHash, MinHash, MinHashLSH

    normalized, first = [], {}
    for i, t in enumerate(texts):           # exact duplicates are removed before near-duplicates
        first.setdefault(normalize_text(t), i)
    keep = sorted(first.values())
    index_of = {old: new for new, old in enumerate(keep)}
    normalized = [normalize_text(texts[i]) for i in keep]
    params = LshParams.for_threshold(THRESHOLD)
    hasher = MinHasher(params)
    ours_bands: list[np.ndarray] = []
    rensa_sigs: list = []
    ds: list = []

    def ours() -> None:
        ours_bands.clear()
        for i in range(0, len(normalized), 512):
            sig, _ = hasher.signatures(normalized[i:i + 512])
            ours_bands.append(hasher.band_hashes(sig))

    def with_rensa() -> None:
        rensa_sigs[:] = rensa.RMinHash.from_token_sets((char_shingles(t) for t in normalized), 128, 42)

    shingled = [char_shingles(t) for t in normalized]

    def rensa_sketch_only() -> None:
        rensa.RMinHash.digest_matrix_from_token_sets(shingled, 128, 42)

    flat: dict[str, list[np.ndarray]] = {"classic": [], "rho": []}

    def rensa_on_our_hashes(kind: str) -> None:
        """rensa's Rust sketches fed with the gate's own 64-bit shingle hashes (numpy), no Python strings."""
        digest = (rensa.RMinHash.digest_matrix_from_flat_token_hashes_rho if kind == "rho"
                  else rensa.RMinHash.digest_matrix_from_flat_token_hashes)
        flat[kind].clear()
        for i in range(0, len(normalized), 512):
            part = normalized[i:i + 512]
            hashes, docs = shingle_hashes(part)
            hashes = hashes[np.argsort(docs, kind="stable")]
            offsets = np.concatenate(([0], np.cumsum(np.bincount(docs, minlength=len(part))))).astype(np.uint64)
            flat[kind].append(np.array(digest(hashes, offsets, 128, 42).to_rows(), dtype=np.uint64))

    runs = [(timed(ours, len(normalized)), timed(with_rensa, len(normalized)),
             timed(rensa_sketch_only, len(normalized)), timed(lambda: rensa_on_our_hashes("classic"), len(normalized)),
             timed(lambda: rensa_on_our_hashes("rho"), len(normalized))) for _ in range(ROUNDS)]
    _, ds_s = timed(lambda: ds.extend(LeanMinHash(m) for m in MinHash.bulk(
        ([s.encode() for s in sh] for sh in shingled), num_perm=128)), len(normalized))

    # near-duplicate candidate pairs of each, with the same banding (bands x rows)
    bands = np.concatenate(ours_bands)
    ours_pairs = {tuple(p) for p in candidate_pairs((bands[:, b] for b in range(params.bands)),
                                                    np.ones(len(normalized), dtype=bool)).tolist()}
    t = time.perf_counter()
    r_lsh = rensa.RMinHashLSH(THRESHOLD, 128, params.bands)
    r_lsh.insert_many(rensa_sigs)
    rensa_pairs = lsh_pairs(r_lsh.query_all(rensa_sigs))
    rensa_lsh_s = time.perf_counter() - t
    t = time.perf_counter()
    d_lsh = MinHashLSH(threshold=THRESHOLD, num_perm=128, params=(params.bands, params.rows))
    with d_lsh.insertion_session() as session:
        for i, m in enumerate(ds):
            session.insert(i, m, check_duplication=False)
    ds_pairs = lsh_pairs([d_lsh.query(m) for m in ds])
    ds_lsh_s = time.perf_counter() - t

    def banded(sig: np.ndarray) -> set[tuple[int, int]]:
        b = hasher.band_hashes(sig)
        return {tuple(p) for p in candidate_pairs((b[:, k] for k in range(params.bands)),
                                                  np.ones(len(sig), dtype=bool)).tolist()}

    flat_pairs = {kind: banded(np.concatenate(mats)) for kind, mats in flat.items()}
    exact: dict[tuple[int, int], float] = {}
    for pair in ours_pairs | rensa_pairs | ds_pairs | flat_pairs["classic"] | flat_pairs["rho"]:
        exact[pair] = shingle_jaccard(normalized[pair[0]], normalized[pair[1]])
    planted = {(min(index_of[a], index_of[b]), max(index_of[a], index_of[b])) for a, b in truth_pairs
               if a in index_of and b in index_of}
    for pair in planted - exact.keys():
        exact[pair] = shingle_jaccard(normalized[pair[0]], normalized[pair[1]])
    positives = {p for p, j in exact.items() if j >= THRESHOLD}

    def quality(pairs: set[tuple[int, int]]) -> tuple[float, float]:
        hits = len(pairs & positives)
        return round(hits / max(1, len(positives)), 4), round(hits / max(1, len(pairs)), 4)

    rate = best_rate([r[0] for r in runs])
    rensa_rate, rensa_only = best_rate([r[1] for r in runs]), best_rate([r[2] for r in runs])
    on_hashes, rho_on_hashes = best_rate([r[3] for r in runs]), best_rate([r[4] for r in runs])
    (h_rec, h_prec), (rho_rec, rho_prec) = quality(flat_pairs["classic"]), quality(flat_pairs["rho"])
    ds_rate = len(normalized) / ds_s
    (o_rec, o_prec), (r_rec, r_prec), (d_rec, d_prec) = quality(ours_pairs), quality(rensa_pairs), quality(ds_pairs)
    return {"minhash_rates": "docs per CPU-second, best of 3 alternating rounds (datasketch: 1)",
            "minhash_docs": len(normalized), "minhash_num_perm": 128, "minhash_lsh_bands_rows": [params.bands, params.rows],
            "minhash_near_dup_pairs": len(positives),
            "minhash_docs_per_s": round(rate, 1), "rensa_docs_per_s": round(rensa_rate, 1),
            "rensa_presplit_docs_per_s": round(rensa_only, 1), "datasketch_bulk_docs_per_s": round(ds_rate, 1),
            "rensa_on_our_hashes_docs_per_s": round(on_hashes, 1),
            "rensa_rho_on_our_hashes_docs_per_s": round(rho_on_hashes, 1),
            "rensa_on_our_hashes_recall": h_rec, "rensa_on_our_hashes_precision": h_prec,
            "rensa_rho_on_our_hashes_recall": rho_rec, "rensa_rho_on_our_hashes_precision": rho_prec,
            "minhash_recall": o_rec, "minhash_precision": o_prec, "rensa_recall": r_rec, "rensa_precision": r_prec,
            "datasketch_bulk_recall": d_rec, "datasketch_bulk_precision": d_prec,
            "rensa_lsh_s": round(rensa_lsh_s, 2), "datasketch_lsh_s": round(ds_lsh_s, 2),
            "minhash_speedup_vs_rensa": round(rate / rensa_rate, 2),
            "minhash_speedup_vs_fastest_rensa": round(rate / max(rensa_rate, rensa_only, on_hashes, rho_on_hashes), 2),
            "minhash_speedup_vs_datasketch_bulk": round(rate / ds_rate, 1)}
