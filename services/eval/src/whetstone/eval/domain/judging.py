"""Pairwise judging: the prompt, the strict verdict parse, both-order tallies. Pure."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

VERDICT = re.compile(r"\[\[([ABC])\]\]")

JUDGE_SYSTEM = (
    "Please act as an impartial judge and evaluate the quality of the responses provided by two AI assistants "
    "to the user question displayed below. Choose the assistant that follows the user's instructions and "
    "answers the question better, considering correctness against the reference answer, helpfulness, "
    "relevance and conciseness. Do not let the order of the responses, their length or the assistants' names "
    "influence you. After your explanation, output your final verdict strictly in this format: "
    "\"[[A]]\" if assistant A is better, \"[[B]]\" if assistant B is better, and \"[[C]]\" for a tie."
)


def judge_prompt(question: str, answer_a: str, answer_b: str, reference: str | None = None) -> str:
    parts = [f"[User Question]\n{question}\n"]
    if reference:
        parts.append(f"[The Start of Reference Answer]\n{reference}\n[The End of Reference Answer]\n")
    parts.append(f"[The Start of Assistant A's Answer]\n{answer_a}\n[The End of Assistant A's Answer]\n")
    parts.append(f"[The Start of Assistant B's Answer]\n{answer_b}\n[The End of Assistant B's Answer]")
    return "\n".join(parts)


class Outcome(StrEnum):
    """A candidate's result on one prompt, over both orders."""

    WIN = "win"
    TIE = "tie"
    LOSS = "loss"
    UNPARSABLE = "unparsable"


_FIRST = {"A": Outcome.WIN, "B": Outcome.LOSS, "C": Outcome.TIE}    # candidate shown as A
_SECOND = {"B": Outcome.WIN, "A": Outcome.LOSS, "C": Outcome.TIE}   # candidate shown as B


def parse_verdict(text: str | None) -> str | None:
    """'A' | 'B' | 'C', or None when the judge gave no verdict or several different ones (never guessed)."""
    found = set(VERDICT.findall(text or ""))
    return found.pop() if len(found) == 1 else None


def combine(candidate_first: str | None, candidate_second: str | None) -> Outcome:
    """Verdicts from the two orders: (candidate as A, base as B) then (base as A, candidate as B).
    A win or loss counts only when both orders agree; an inconsistent pair is a tie."""
    if candidate_first is None or candidate_second is None:
        return Outcome.UNPARSABLE
    first, second = _FIRST[candidate_first], _SECOND[candidate_second]
    return first if first == second else Outcome.TIE


@dataclass(frozen=True)
class Tally:
    win: int
    tie: int
    loss: int
    unparsable: int

    @property
    def judged(self) -> int:
        return self.win + self.tie + self.loss

    @property
    def adjusted_win_rate(self) -> float:
        return (self.win + 0.5 * self.tie) / self.judged if self.judged else 0.0


def tally(outcomes: Sequence[Outcome]) -> Tally:
    return Tally(*(sum(o == k for o in outcomes) for k in (Outcome.WIN, Outcome.TIE, Outcome.LOSS,
                                                          Outcome.UNPARSABLE)))
