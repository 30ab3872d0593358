"""Pluggable toxicity classifiers: 'builtin', 'off', or 'package.module:attr' (a class/factory or instance)."""

from __future__ import annotations

import importlib

from ..domain.toxicity import ToxicityClassifier, WordlistToxicity


def load_toxicity_classifier(spec: str | None) -> ToxicityClassifier | None:
    if spec in (None, "", "off", "none"):
        return None
    if spec == "builtin":
        return WordlistToxicity()
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"toxicity classifier {spec!r}: use 'builtin', 'off' or 'package.module:attr'")
    target = getattr(importlib.import_module(module_name), attr)
    classifier = target() if isinstance(target, type) or not hasattr(target, "scores") else target
    if not callable(getattr(classifier, "scores", None)):
        raise ValueError(f"toxicity classifier {spec!r} has no scores(texts) method")
    return classifier
