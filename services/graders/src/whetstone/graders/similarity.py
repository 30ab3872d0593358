"""text_similarity metrics, written here (no corpus downloads, no heavy dependencies). Each returns
a score in [0, 1]; `input` is the text graded, `reference` the text it is compared with.

- fuzzy_match: 1 - indel distance / (len(input) + len(reference)) over characters (the normalised
  Levenshtein ratio without substitutions, as rapidfuzz's `fuzz.ratio` / 100), case-sensitive.
- bleu: sentence BLEU-4 (uniform weights, clipped n-gram precision, brevity penalty), add-one
  smoothing for n > 1 so that a short exact prefix is not zero (Lin & Och 2004).
- gleu: sentence Google-BLEU (Wu et al. 2016): min(n-gram precision, n-gram recall) over n = 1..4.
- meteor: METEOR on exact unigram matches (no stemming or synonyms: no WordNet offline): harmonic
  mean weighted to recall (alpha 0.9) times (1 - 0.5 * (chunks / matches) ^ 3).
- rouge_1..rouge_5: F1 of clipped n-gram overlap; rouge_l: F1 of the longest common subsequence.

BLEU, GLEU and METEOR split lower-cased text into words and punctuation marks; ROUGE keeps lower-cased
letters and digits only (as the reference `rouge_score` tokenizer). The longest common subsequence
is computed bit-parallel (Hyyrö 2004) with Python integers: linear in the length of one text per
element of the other."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from functools import partial

WORDS = re.compile(r"\w+|[^\w\s]", re.UNICODE)
ALNUM = re.compile(r"[^\W_]+", re.UNICODE)


def words(text: str) -> list[str]:
    return WORDS.findall(text.lower())


def rouge_tokens(text: str) -> list[str]:
    return ALNUM.findall(text.lower())


def lcs_length(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """Length of the longest common subsequence (bit-vector algorithm over `a`'s positions)."""
    if not a or not b:
        return 0
    masks: dict[Hashable, int] = {}
    for i, x in enumerate(a):
        masks[x] = masks.get(x, 0) | (1 << i)
    full = (1 << len(a)) - 1
    v = full
    for y in b:
        u = v & masks.get(y, 0)
        v = ((v + u) | (v - u)) & full
    return len(a) - bin(v).count("1")


def fuzzy_match(text: str, reference: str) -> float:
    total = len(text) + len(reference)
    if total == 0:
        return 1.0
    return 2 * lcs_length(text, reference) / total


def ngrams(tokens: Sequence[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def overlap(a: Counter[tuple[str, ...]], b: Counter[tuple[str, ...]]) -> int:
    return sum((a & b).values())


def bleu(text: str, reference: str, max_n: int = 4) -> float:
    cand, ref = words(text), words(reference)
    if not cand or not ref:
        return float(cand == ref)
    logs = 0.0
    for n in range(1, max_n + 1):
        c = ngrams(cand, n)
        matched, total = overlap(c, ngrams(ref, n)), sum(c.values())
        if n == 1 and matched == 0:
            return 0.0
        p = matched / total if n == 1 else (matched + 1) / (total + 1)
        logs += math.log(p) / max_n
    brevity = 1.0 if len(cand) >= len(ref) else math.exp(1 - len(ref) / len(cand))
    return brevity * math.exp(logs)


def gleu(text: str, reference: str, max_n: int = 4) -> float:
    cand, ref = words(text), words(reference)
    if not cand or not ref:
        return float(cand == ref)
    matched = cand_total = ref_total = 0
    for n in range(1, max_n + 1):
        c, r = ngrams(cand, n), ngrams(ref, n)
        matched += overlap(c, r)
        cand_total += sum(c.values())
        ref_total += sum(r.values())
    if matched == 0:
        return 0.0
    return min(matched / cand_total, matched / ref_total)


def meteor(text: str, reference: str, alpha: float = 0.9, beta: float = 3.0, gamma: float = 0.5) -> float:
    cand, ref = words(text), words(reference)
    if not cand or not ref:
        return float(cand == ref)
    used: set[int] = set()
    pairs: list[tuple[int, int]] = []          # (candidate position, reference position)
    for i, token in enumerate(cand):
        for j, other in enumerate(ref):
            if j not in used and other == token:
                used.add(j)
                pairs.append((i, j))
                break
    m = len(pairs)
    if m == 0:
        return 0.0
    precision, recall = m / len(cand), m / len(ref)
    fmean = precision * recall / (alpha * precision + (1 - alpha) * recall)
    chunks = 1 + sum(1 for (i0, j0), (i1, j1) in zip(pairs, pairs[1:]) if not (i1 == i0 + 1 and j1 == j0 + 1))
    return fmean * (1 - gamma * math.pow(chunks / m, beta))


def f1(matched: int, cand_total: int, ref_total: int) -> float:
    if matched == 0 or cand_total == 0 or ref_total == 0:
        return 0.0
    p, r = matched / cand_total, matched / ref_total
    return 2 * p * r / (p + r)


def rouge_n(text: str, reference: str, n: int) -> float:
    c, r = ngrams(rouge_tokens(text), n), ngrams(rouge_tokens(reference), n)
    return f1(overlap(c, r), sum(c.values()), sum(r.values()))


def rouge_l(text: str, reference: str) -> float:
    cand, ref = rouge_tokens(text), rouge_tokens(reference)
    return f1(lcs_length(ref, cand), len(cand), len(ref))


LEXICAL: dict[str, Callable[[str, str], float]] = {
    "fuzzy_match": fuzzy_match, "bleu": bleu, "gleu": gleu, "meteor": meteor, "rouge_l": rouge_l,
    **{f"rouge_{n}": partial(rouge_n, n=n) for n in range(1, 6)},
}


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0
