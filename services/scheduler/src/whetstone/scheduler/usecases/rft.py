"""Reinforcement fine-tuning requests: `method = {"type": "reinforcement", "reinforcement": {grader,
hyperparameters, response_format}}` as OpenAI's client sends it, checked before a job exists.

The method object is parsed and resolved by `whetstone.graders.rft` (unknown fields refused by
name, every knob "auto" or a number); the grader is validated against this deployment (judge models
the operator configured, cosine's embeddings endpoint, a working python sandbox, formulas over the
multi grader's own names). Each refusal is a 400 whose `param` is the field's path under `method`.
The data gate (last message `user`, every `{{item.x}}` in every row) needs the rows: it runs where
the rows are read (`check_rows`), and the job needs a training file of purpose `rft`."""

from __future__ import annotations

from typing import Any

from whetstone.contracts import ReinforcementSpec
from whetstone.graders import GraderEnvironment, GraderInvalid, GraderSettings, validate
from whetstone.graders.rft import parse_method
from whetstone.runtime.errors import ApiError

def environment() -> GraderEnvironment:
    """A grader environment from the operator's settings (python sandbox, judge HTTP client); the
    scheduler builds one at start-up (SchedulerContext.graders)."""
    return GraderEnvironment(GraderSettings())


def reinforcement_spec(data: Any, env: GraderEnvironment) -> ReinforcementSpec:
    if not isinstance(data, dict):
        raise ApiError(400, "method.reinforcement: required with method.type 'reinforcement' "
                            "({\"grader\": {...}, \"hyperparameters\": {...}})", code="missing_required_parameter",
                       param="method.reinforcement")
    try:
        plan = parse_method(data, "method.reinforcement")
        validate(plan.grader, env.settings, env.sandbox, "method.reinforcement.grader")
    except GraderInvalid as exc:
        raise ApiError(400, exc.message if exc.message.startswith(exc.param) else f"{exc.param}: {exc.message}",
                       code=exc.code, param=exc.param) from exc
    return ReinforcementSpec(**plan.record())


def epoch_tokens(tokens: int | None, rows: int | None, spec: ReinforcementSpec | None) -> int | None:
    """What one epoch of a reinforcement job processes at most, for its runtime and cost estimate:
    every prompt is sampled `generations` times (compute_multiplier) and each completion may use the
    whole budget (reasoning_effort); the sampled tokens are also scored by the policy (counted once)."""
    if tokens is None or spec is None:
        return tokens
    return spec.generations * (tokens + int(rows or 0) * spec.max_completion_tokens)
