"""Task metrics computed on generated answers: exact match, token F1, label accuracy. Pure."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

METRICS = ("exact_match", "token_f1", "label_accuracy")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    """SQuAD-style: lowercase, drop punctuation and articles, squeeze whitespace."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


def exact_match(prediction: str, reference: str) -> float:
    return float(normalize(prediction) == normalize(reference))


def token_f1(prediction: str, reference: str) -> float:
    pred, ref = normalize(prediction).split(), normalize(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def predicted_label(prediction: str, labels: Sequence[str]) -> str | None:
    """The label the answer gives: the known label its normalized text starts with (longest first)."""
    text = normalize(prediction)
    for label in sorted((normalize(lab) for lab in labels), key=len, reverse=True):
        if label and (text == label or text.startswith(label + " ")):
            return label
    return None


def label_accuracy(predictions: Sequence[str], references: Sequence[str]) -> float:
    labels = sorted(set(references))
    hits = sum(predicted_label(p, labels) == normalize(r) for p, r in zip(predictions, references))
    return hits / len(references) if references else 0.0


def majority_baseline(references: Sequence[str]) -> float:
    """Accuracy of always answering the most frequent label: the floor a label task must beat."""
    if not references:
        return 0.0
    return Counter(normalize(r) for r in references).most_common(1)[0][1] / len(references)


def choose_metric(references: Sequence[str], requested: str | None = None) -> str:
    """The job's choice, else from the data: few distinct short targets -> labels; short -> exact match."""
    if requested and requested != "auto":
        if requested not in METRICS:
            raise ValueError(f"holdout metric must be one of {', '.join(METRICS)} or auto, got {requested!r}")
        return requested
    if not references:
        return "token_f1"
    words = [len(normalize(r).split()) for r in references]
    distinct = len({normalize(r) for r in references})
    if max(words) <= 3 and distinct <= max(2, min(20, len(references) // 3)):
        return "label_accuracy"
    if sum(words) / len(words) <= 4:
        return "exact_match"
    return "token_f1"


def score(metric: str, predictions: Sequence[str], references: Sequence[str]) -> float:
    if not references:
        raise ValueError("no references to score")
    if metric == "label_accuracy":
        return label_accuracy(predictions, references)
    fn = exact_match if metric == "exact_match" else token_f1
    return sum(fn(p, r) for p, r in zip(predictions, references)) / len(references)
