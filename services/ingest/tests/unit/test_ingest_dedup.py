"""Exact-duplicate digests, the compact key set, MinHash/LSH and exact-Jaccard verification."""

import random

import numpy as np
import pytest

from whetstone.ingest.domain.hashing import HashSet64, mix64, sorted_unique
from whetstone.ingest.domain.minhash import (
    LshParams, MinHasher, block_jaccards, candidate_pairs, clusters, exact_jaccard, shingle_hashes, shingle_set,
    shingle_sets, verify_pairs,
)
from whetstone.ingest.domain.text import digest_key, fingerprint, in_validation_split, normalize_text

pytestmark = pytest.mark.unit

RNG = random.Random(3)
VOCAB = ["".join(RNG.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(RNG.randint(2, 9))) for _ in range(3000)]


def doc(n: int = 250) -> str:
    return " ".join(RNG.choice(VOCAB) for _ in range(n))


def mutate(text: str, k: int) -> str:
    words = text.split()
    for i in RNG.sample(range(len(words)), k):
        words[i] = RNG.choice(VOCAB)
    return " ".join(words)


def true_jaccard(a: str, b: str) -> float:
    sa = {a[i:i + 5] for i in range(len(a) - 4)}
    sb = {b[i:i + 5] for i in range(len(b) - 4)}
    return len(sa & sb) / len(sa | sb)


def test_normalization_and_fingerprint():
    assert normalize_text("  Hello\n\tWORLD  ") == "hello world"
    assert normalize_text("ｆｕｌｌ") == "full"  # NFKC
    a = fingerprint([{"role": "user", "content": "Hi  There"}, {"role": "assistant", "content": "Yes"}])
    b = fingerprint([{"role": "user", "content": "hi there"}, {"role": "assistant", "content": " yes "}])
    c = fingerprint([{"role": "assistant", "content": "hi there"}, {"role": "assistant", "content": "yes"}])
    assert a == b and a[1] != c[1] and a[0] == "hi there yes"
    assert digest_key(a[1]) != 0


def test_deterministic_split_fraction():
    digests = [fingerprint([{"role": "user", "content": f"row {i}"}])[1] for i in range(4000)]
    sides = [in_validation_split(d, 0.1) for d in digests]
    assert sides == [in_validation_split(d, 0.1) for d in digests]
    assert 0.07 < sum(sides) / len(sides) < 0.13
    assert not any(in_validation_split(d, 0.0) for d in digests)


def test_hashset_add_contains_and_growth():
    keys = mix64(np.arange(1, 50_001, dtype=np.uint64))
    s = HashSet64()
    assert s.add(keys[:30_000]) == 30_000
    assert s.add(keys[20_000:]) == 20_000 and len(s) == 50_000
    assert s.contains(keys).all()
    assert not s.contains(mix64(np.arange(60_000, 70_000, dtype=np.uint64))).any()
    assert s.nbytes <= 50_000 * 36  # compact: 16 to 32 bytes per key (load 1/4 to 1/2) + a 1/16 bitmap
    z = HashSet64()
    z.add(np.array([0, 5, 5], dtype=np.uint64))
    assert z.contains(np.array([0, 5, 6], dtype=np.uint64)).tolist() == [True, True, False]


def test_sorted_unique():
    assert sorted_unique(np.array([3, 1, 3, 2, 1], dtype=np.uint64)).tolist() == [1, 2, 3]
    assert sorted_unique(np.array([], dtype=np.uint64)).size == 0


def test_batched_shingles_match_single_documents():
    texts = ["abcdefg", "", "xy", "hello world", doc(30)]
    hashes, docs = shingle_hashes(texts)
    for i, t in enumerate(texts):
        assert sorted(hashes[docs == i].tolist()) == sorted(shingle_hashes([t])[0].tolist())
    assert (docs == 0).sum() == 3 and (docs == 1).sum() == 0 and (docs == 2).sum() == 1


def test_exact_jaccard_equals_set_jaccard():
    a, b = doc(), None
    b = mutate(a, 10)
    assert exact_jaccard(shingle_set(a), shingle_set(b)) == pytest.approx(true_jaccard(a, b), abs=1e-9)
    assert exact_jaccard(shingle_set(a), shingle_set(a)) == 1.0


def test_batched_shingle_sets_and_jaccard_match_one_text_at_a_time():
    texts = [doc(), "ab", "", mutate(doc(), 3), "tiny text", "x"]
    for got, text in zip(shingle_sets(texts), texts, strict=True):
        assert got.tolist() == shingle_set(text).tolist()
    sets = shingle_sets(texts)
    for a in sets:
        for b in sets:
            inter = len(set(a.tolist()) & set(b.tolist()))
            union = len(set(a.tolist()) | set(b.tolist()))
            assert exact_jaccard(a, b) == (inter / union if union else 1.0)


def test_lsh_params_for_threshold():
    p = LshParams.for_threshold(0.9)
    assert p.bands * p.rows <= 128 and p.candidate_probability(0.9) >= 0.999
    assert p.candidate_probability(0.5) < 0.1
    assert LshParams.for_threshold(0.7).rows < p.rows
    with pytest.raises(ValueError):
        LshParams.for_threshold(0.9, num_perm=100)


def test_signature_agreement_estimates_jaccard_and_batches_are_consistent():
    hasher = MinHasher(LshParams.for_threshold(0.9))
    base = doc()
    pairs = [(base, mutate(base, k)) for k in (2, 8, 20, 60)]
    texts = [t for p in pairs for t in p]
    sig, counts = hasher.signatures(texts)
    assert (counts > 0).all()
    for i, (a, b) in enumerate(pairs):
        estimate = (sig[2 * i] == sig[2 * i + 1]).mean()
        assert abs(estimate - true_jaccard(a, b)) < 0.12
    alone, _ = hasher.signatures([texts[3]])
    assert (alone[0] == sig[3]).all()


def test_short_texts_get_full_densified_signatures():
    hasher = MinHasher(LshParams.for_threshold(0.9))
    sig, counts = hasher.signatures(["tiny text", "tiny text", "ab", ""])
    assert (sig[0] == sig[1]).all() and counts.tolist()[:3] == [5, 5, 1] and counts[3] == 0
    assert (sig[0] != np.iinfo(np.uint64).max).all() and (sig[2] != np.iinfo(np.uint64).max).all()


def test_near_duplicates_found_verified_and_clustered():
    hasher = MinHasher(LshParams.for_threshold(0.9))
    a = doc()
    texts = [a, doc(), mutate(a, 2), doc(), mutate(a, 40), a[:-1] + "Z"]
    sig, counts = hasher.signatures(texts)
    bands = hasher.band_hashes(sig)
    pairs = candidate_pairs((bands[:, b] for b in range(bands.shape[1])), counts > 0)
    sets = {i: shingle_set(t) for i, t in enumerate(texts)}
    edges, scores = verify_pairs(pairs, lambda part: block_jaccards(part, lambda rows: [sets[i] for i in rows]),
                                 0.9)
    assert {tuple(e) for e in edges.tolist()} >= {(0, 2), (0, 5)}
    assert all(s >= 0.9 for s in scores)
    assert not any(4 in e for e in edges.tolist())  # 40 substitutions: well below 0.9
    assert clusters(edges) == [[0, 2, 5]]


def test_big_buckets_give_linear_not_quadratic_pairs():
    column = np.zeros(1000, dtype=np.uint64)
    pairs = candidate_pairs([column], np.ones(1000, dtype=bool))
    assert len(pairs) == 999 + 998  # star to the first + chain: 2 per member
    assert pairs[:, 0].min() == 0 and (pairs[:, 0] < pairs[:, 1]).all()
    none = candidate_pairs([np.arange(5, dtype=np.uint64)], np.ones(5, dtype=bool))
    assert none.shape == (0, 2)
    masked = candidate_pairs([column[:4]], np.array([True, False, True, False]))
    assert masked.tolist() == [[0, 2]]


def test_clusters_are_connected_components():
    edges = np.array([[1, 2], [2, 3], [7, 9], [3, 1]], dtype=np.int64)
    assert clusters(edges) == [[1, 2, 3], [7, 9]]
    assert clusters(np.zeros((0, 2), dtype=np.int64)) == []
