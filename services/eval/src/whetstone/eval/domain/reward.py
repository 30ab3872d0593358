"""The held-out stage of a reinforcement fine-tuning job: the job's own grader scores greedy
completions of the candidate and of the base on held-out prompts, and the candidate passes when
its mean reward beats the base's by the margin (`whetstone.graders.rft.reward_gate`). Pure."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from whetstone.contracts import EvalStageResult, Metric
from whetstone.contracts.enums import StageStatus
from whetstone.graders.rft import reward_gate

from .policy import HoldoutPolicy, Stage

STAGE = Stage.HOLDOUT


@dataclass(frozen=True)
class RewardScores:
    grader: str                  # the grader's name and type, as the job declared it
    base: Sequence[float]        # one reward per held-out prompt
    candidate: Sequence[float]
    base_errors: int = 0         # completions whose grading recorded an error (scored 0.0, as OpenAI does)
    candidate_errors: int = 0


def decide_reward(s: RewardScores, policy: HoldoutPolicy) -> EvalStageResult:
    n = len(s.candidate)
    if n == 0 or len(s.base) != n:
        return EvalStageResult(name=STAGE, status=StageStatus.FAILED, reason=f"no held-out prompts to grade (base {len(s.base)}, "
                                                                   f"candidate {n})", details={"metric": "reward"})
    base, cand = statistics.fmean(s.base), statistics.fmean(s.candidate)
    metrics = [Metric(name="holdout_reward", base=base, candidate=cand, higher_is_better=True)]
    details = {"metric": "reward", "grader": s.grader, "rows": n, "margin": policy.min_reward_gain,
               "base_std": statistics.pstdev(s.base), "candidate_std": statistics.pstdev(s.candidate),
               "grader_errors": {"base": s.base_errors, "candidate": s.candidate_errors}}
    if not (math.isfinite(base) and math.isfinite(cand)):
        return EvalStageResult(name=STAGE, status=StageStatus.FAILED, metrics=metrics, details=details,
                               reason=f"mean reward is not finite (base {base}, candidate {cand})")
    gate = reward_gate(base, cand, policy.min_reward_gain)
    reason = f"grader {s.grader} on {n} held-out prompts: {gate.reason}"
    if s.candidate_errors:
        reason += f"; {s.candidate_errors} candidate completion(s) had grader errors (scored 0)"
    return EvalStageResult(name=STAGE, status=StageStatus(gate.verdict), metrics=metrics, details=details, reason=reason)
