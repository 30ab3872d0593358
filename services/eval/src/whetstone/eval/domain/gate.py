"""The eval gate: scores in, verdict and reasons out. Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class GatePolicy:
    min_improvement: float = 0.0        # candidate loss must be at least this fraction below base
    max_regression_vs_last: float = 0.05  # and not more than this fraction above the last accepted model


def decide(base_loss: float, candidate_loss: float, last_accepted_loss: float | None,
           policy: GatePolicy = GatePolicy()) -> tuple[str, list[str]]:
    reasons: list[str] = []
    if not math.isfinite(candidate_loss):
        return "failed", [f"holdout loss is not finite ({candidate_loss})"]
    change = (candidate_loss - base_loss) / base_loss if base_loss else 0.0
    threshold = base_loss * (1 - policy.min_improvement)
    ok = candidate_loss < threshold or (policy.min_improvement == 0 and candidate_loss <= base_loss)
    reasons.append(f"holdout loss {candidate_loss:.4f} vs base {base_loss:.4f} ({change:+.1%})"
                   + ("" if ok else f": needs to be below {threshold:.4f}"))
    if last_accepted_loss is not None:
        limit = last_accepted_loss * (1 + policy.max_regression_vs_last)
        if candidate_loss > limit:
            ok = False
            reasons.append(f"regresses against the last accepted model ({last_accepted_loss:.4f}, limit {limit:.4f})")
        else:
            reasons.append(f"within {policy.max_regression_vs_last:.0%} of the last accepted model "
                           f"({last_accepted_loss:.4f})")
    return ("passed" if ok else "failed"), reasons
