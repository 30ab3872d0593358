"""Toxicity filter: a pluggable classifier interface and a simple built-in default. Pure.

Any object with `name` and `scores(texts) -> list[float]` (0 = clean, 1 = toxic) can be
plugged in (see `adapters.plugins.load_toxicity_classifier`, e.g. a transformers
text-classification pipeline). The built-in `WordlistToxicity` scores a text by
counting strong profanity/abuse terms and threat phrases: one hit scores 0.5, two or
more score 1.0. It is deliberately simple and transparent; it is a default, not a
moderation model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from .contamination import WORD_BYTES, NgramHasher, words

_WORD = re.compile(r"[0-9a-z]+")     # what `words` keeps of an ASCII text


class ToxicityClassifier(Protocol):
    name: str

    def scores(self, texts: Sequence[str]) -> list[float]: ...


_TERMS = (
    "fuck", "fucking", "fucker", "motherfucker", "shit", "bullshit", "bitch", "bastard", "asshole", "cunt",
    "dickhead", "twat", "wanker", "slut", "whore", "retard", "retarded",
)
_PHRASES = ("kill yourself", "i will kill you", "i'm going to kill you", "go die", "you should die",
            "hope you die", "shoot you", "rape you")


class WordlistToxicity:
    name = "builtin-wordlist"

    def __init__(self, extra_terms: Sequence[str] = ()) -> None:
        extra = [t.lower() for t in extra_terms]
        self.phrases = (*_PHRASES, *(t for t in extra if " " in t))
        self.terms = (*_TERMS, *(t for t in extra if " " not in t))
        # phrases grouped by their last word: a text without that word holds none of the group
        groups: dict[str, list[str]] = {}
        for p in self.phrases:
            groups.setdefault(p.split()[-1] if p.strip() else p, []).append(p)
        self.phrase_groups = tuple((key, tuple(ps)) for key, ps in groups.items())
        self.term_words = frozenset(t.encode() for t in self.terms)
        # the terms no other term is part of: one of them is in a text whenever any term is
        self.needles = tuple(t for t in dict.fromkeys(self.terms) if not any(o != t and o in t for o in self.terms))
        # the hashes `NgramHasher.word_hashes` gives the terms that can be a whole word of an ASCII text;
        # None when a term is too long for its hash to tell it from a longer word (compared on 24 bytes)
        wordlike = [t for t in self.terms if _WORD.fullmatch(t)]
        too_long = any(len(t) >= WORD_BYTES for t in wordlike)
        self.term_hashes = None if too_long else NgramHasher().word_hashes(wordlike)[0]

    def score(self, text: str) -> float:
        lowered = text.lower()
        terms = 0
        if any(t in lowered for t in self.needles):  # cheap substring test first, whole words only on a hit
            terms = sum(1 for w in words(lowered) if w in self.term_words)
        return self._score(lowered, terms)

    def _score(self, lowered: str, term_hits: int) -> float:
        """Phrases are matched in the lowered text; each hit, phrase or whole-word term, adds 0.5."""
        phrases = 0
        for key, ps in self.phrase_groups:
            if key in lowered:
                phrases += sum(1 for p in ps if p in lowered)
        return min(1.0, 0.5 * (term_hits + phrases))

    def scores(self, texts: Sequence[str]) -> list[float]:
        return [self.score(t) for t in texts]

    def scores_with_words(self, texts: Sequence[str], word_hash: np.ndarray, word_doc: np.ndarray) -> list[float]:
        """`scores`, given `NgramHasher.word_hashes` of the texts' normalized forms (as contamination
        computes them): for an ASCII text those are the words of the lowered text, so its whole-word
        term hits are counted from the hashes, without a search per term; other texts are scored
        one by one."""
        if self.term_hashes is None:
            return self.scores(texts)
        hit = np.isin(word_hash, self.term_hashes)
        term_hits = np.bincount(word_doc[hit], minlength=len(texts)).tolist()
        return [self._score(text.lower(), n) if text.isascii() else self.score(text)
                for text, n in zip(texts, term_hits)]
