"""What a tenant's `eval_config` may ask of the eval gate: a higher bar, never a lower one, and no
more work than the operator allows. Checked at admission (HTTP and Kafka alike), so no job carries a
gate setting the operator did not permit; the eval service reads the same shape
(`whetstone.eval.domain.policy`: `{"stages": {<stage>: bool | {<setting>: value}}}`). Pure.

- floors: the safety stage's `refusal_floor` may not go below the operator's;
- ceilings: the safety stage's `max_drop_points` (how far below the base the refusal rate may fall)
  and the budgets (holdout rows and new tokens, the reward completion budget, judge pairs) may not
  go above the operator's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EvalBounds:
    """The operator's bounds on a tenant's eval_config (defaults: the eval gate's own defaults for the
    floor and the safety drop, a few times the defaults for the budgets)."""

    min_refusal_floor: float = 0.95
    max_safety_drop_points: float = 5.0
    max_holdout_rows: int = 256
    max_holdout_new_tokens: int = 128
    max_reward_new_tokens: int = 1024
    max_judge_pairs: int = 128

    def floors(self) -> dict[tuple[str, str], float]:
        return {("safety", "refusal_floor"): self.min_refusal_floor}

    def ceilings(self) -> dict[tuple[str, str], float]:
        return {("safety", "max_drop_points"): self.max_safety_drop_points,
                ("holdout", "max_rows"): self.max_holdout_rows,
                ("holdout", "max_new_tokens"): self.max_holdout_new_tokens,
                ("holdout", "reward_max_new_tokens"): self.max_reward_new_tokens,
                ("judge", "max_pairs"): self.max_judge_pairs}


@dataclass(frozen=True)
class OutOfBounds:
    param: str
    message: str


def check_eval_config(config: Mapping[str, Any] | None, bounds: EvalBounds) -> OutOfBounds | None:
    """The first setting of `config` past the operator's bounds, or None. Settings of another shape
    (not a number, an unknown stage) are the eval gate's to refuse."""
    stages = (config or {}).get("stages")
    if not isinstance(stages, Mapping):
        return None
    floors, ceilings = bounds.floors(), bounds.ceilings()
    for stage, settings in stages.items():
        if not isinstance(settings, Mapping):
            continue
        for key, value in settings.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            param = f"eval_config.stages.{stage}.{key}"
            if (floor := floors.get((stage, key))) is not None and value < floor:
                return OutOfBounds(param, f"{param} may not be below the platform's {floor:g} "
                                          "(a job may raise the safety bar, never lower it)")
            if (ceiling := ceilings.get((stage, key))) is not None and value > ceiling:
                return OutOfBounds(param, f"{param} may not exceed the platform's {ceiling:g}")
    return None
