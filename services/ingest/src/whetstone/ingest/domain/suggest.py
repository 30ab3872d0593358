"""'Did you mean …?' for keys and roles that look like a typo of a known one. Pure."""

from __future__ import annotations

from collections.abc import Iterable


def edit_distance(a: str, b: str) -> int:
    """Optimal string alignment distance (insert, delete, substitute, swap two neighbours)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known word `word` is most likely a typo of: same letters up to case, or within 1 edit
    (words of up to 5 letters) or 2 edits (longer words); None for short or unrelated words."""
    if len(word) < 4 or len(word) > 64:
        return None
    w = word.lower()
    best: tuple[int, str] | None = None
    for k in known:
        if k == word:
            return None
        d = edit_distance(w, k)
        if d <= (1 if len(k) <= 5 else 2) and (best is None or d < best[0]):
            best = (d, k)
    return best[1] if best else None
