"""Auto-promotion policy: production without a human when the eval margins are wide. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from whetstone.contracts import EvalStageResult, Metric


@dataclass(frozen=True)
class PolicyResult:
    passed: bool
    reason: str


def margin(metric: Metric) -> float | None:
    """Relative improvement of the candidate over the base (positive = better), None without a base."""
    base = metric.base
    if base is None or base == 0:
        return None
    gain = metric.candidate - base if metric.higher_is_better else base - metric.candidate
    return gain / abs(base)


def regressed(metric: Metric) -> bool:
    """Worse than the last accepted model of the name."""
    last = metric.last_accepted
    if last is None:
        return False
    return metric.candidate < last if metric.higher_is_better else metric.candidate > last


def auto_promotion(verdict: str | None, metrics: Sequence[Metric], stages: Sequence[EvalStageResult],
                   min_margin: float) -> PolicyResult:
    """Passes only when the gate passed, no stage failed, every metric with a base improved by at
    least `min_margin` (relative) and none regressed against the last accepted model. With per-stage
    results, only the metrics of stages that passed count (a skipped stage is never cited)."""
    if verdict != "passed":
        return PolicyResult(False, f"eval verdict is {verdict or 'missing'}")
    failed = [s.name for s in stages if s.status == "failed"]
    if failed:
        return PolicyResult(False, f"eval stage(s) failed: {', '.join(failed)}")
    if stages:   # only what a stage that ran and passed measured: a skipped stage's figures decide nothing
        metrics = [m for s in stages if s.status == "passed" for m in s.metrics]
    skipped = sorted(s.name for s in stages if s.status == "skipped")
    margins = {m.name: margin(m) for m in metrics}
    known = {k: v for k, v in margins.items() if v is not None}
    if not known:
        return PolicyResult(False, "no metric compares the candidate with the base model")
    worst_name, worst = min(known.items(), key=lambda kv: kv[1])
    if worst < min_margin:
        return PolicyResult(False, f"{worst_name} margin {worst:+.1%} is below the auto-promotion threshold "
                                   f"{min_margin:.1%}")
    for m in metrics:
        if regressed(m):
            return PolicyResult(False, f"{m.name} regressed against the last accepted model")
    ran = ", ".join(s.name for s in stages if s.status == "passed")
    return PolicyResult(True, f"every eval margin >= {min_margin:.1%} (smallest: {worst_name} {worst:+.1%})"
                              + (f" over the stages that ran ({ran})" if ran else "")
                              + (f"; not considered, skipped: {', '.join(skipped)}" if skipped else ""))
