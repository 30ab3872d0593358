"""The held-out stage of a reinforcement fine-tuning job (method `reinforcement`): the job's own
grader (`whetstone.graders`) scores one greedy completion per held-out prompt from the candidate
adapter and from the base, and `domain.reward.decide_reward` gates on the mean rewards
(`reward_gate`: the candidate must beat the base by `holdout.min_reward_gain`). It takes the
place of the reference-answer holdout stage; benchmarks and safety run as for every method, and the
pairwise judge is skipped (the rows carry no reference answer: the grader is the judge).

The held-out rows are ingest's rft rows (the job's validation file or its split): `messages`
ending with a user turn, every other key the grader's `{{item.x}}`. The base side (completions and
rewards) is cached per base SHA, held-out file, grader and budget, as the other stages' are."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, JsonValue, ValidationError
from whetstone.contracts import EvalStageResult, ReinforcementSpec
from whetstone.graders import (
    AnyGrader,
    GraderEnvironment,
    GraderInvalid,
    GraderSettings,
    RunResult,
    parse_grader,
    run_grader,
)
from whetstone.graders.rft import RftRecord, RowMessage

from ..adapters.holdout import HoldoutError, read_rows
from ..domain.policy import HoldoutPolicy
from ..domain.reward import STAGE, RewardScores, decide_reward
from ..domain.rows import RftRow, Side, Turn
from ..domain.stages import failed, skipped, with_details
from .pipeline import GateModels, ScoreCache


class BaseSide(BaseModel):
    """The base model's graded completions, as the stage caches them per base SHA."""

    answers: list[str]
    rewards: list[float]
    errors: int


def _text(message: RowMessage) -> str | None:
    if isinstance(message.content, list):
        return "\n".join(p.text for p in message.content if p.type == "text" and p.text is not None)
    return message.content


def _row(obj: Any, line_no: int) -> RftRow:
    where = f"validation file line {line_no}"
    try:
        record = RftRecord.parse(obj)
    except ValidationError as exc:
        loc = exc.errors()[0]["loc"]
        if len(loc) >= 2 and isinstance(loc[1], int):
            raise HoldoutError(f"{where}: messages[{loc[1]}] needs a string 'role' and text 'content'") from exc
        raise HoldoutError(f"{where}: expected an object with a non-empty 'messages' list (an rft row)") from exc
    prompt = []
    for i, m in enumerate(record.messages):
        text = _text(m)
        if text is None:
            raise HoldoutError(f"{where}: messages[{i}] needs a string 'role' and text 'content'")
        prompt.append(Turn(m.role, text))
    if record.messages[-1].role != "user":
        raise HoldoutError(f"{where}: the last message is {record.messages[-1].role!r}; a reinforcement job's "
                           "held-out prompts end with the user's turn")
    return RftRow(prompt, record.item)


def read_rft_holdout(path: Path, limit: int) -> list[RftRow]:
    return read_rows(path, limit, _row)


def grade(grader: AnyGrader, texts: list[str], items: list[dict[str, JsonValue]],
          settings: GraderSettings | None = None) -> tuple[list[float], int]:
    """Each completion's reward (a grading error scores 0.0, as in OpenAI's API) and how many erred.
    Runs its own event loop: called from the gate's worker thread."""
    async def all_of() -> list[RunResult]:
        env = GraderEnvironment(settings)
        try:
            return list(await asyncio.gather(*(run_grader(grader, t, i, env) for t, i in zip(texts, items))))
        finally:
            await env.close()

    results = asyncio.run(all_of())
    return [r.reward for r in results], sum(1 for r in results if r.metadata.errors.any())


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:32]


def reward_stage(spec: ReinforcementSpec, holdout_path: Path | None, missing_reason: str, base_sha: str,
                 policy: HoldoutPolicy, cache: ScoreCache, models: Callable[[], GateModels],
                 grader_settings: GraderSettings | None = None) -> EvalStageResult:
    """The stage's result for the job's reinforcement method; the models are loaded only when there is
    something to grade."""
    if holdout_path is None:
        reason = missing_reason + ": no held-out prompts to grade (never scored on training data)"
        return failed(STAGE, reason) if policy.require_holdout else skipped(STAGE, reason)
    try:
        grader = parse_grader(spec.grader, "reinforcement.grader")
    except GraderInvalid as exc:
        return failed(STAGE, f"the job's grader cannot be used: {exc.param}: {exc.message}")
    try:
        rows = read_rft_holdout(holdout_path, policy.max_rows)
    except (HoldoutError, UnicodeDecodeError) as exc:
        return failed(STAGE, f"validation file unusable: {exc}")
    if not rows:
        reason = "validation file is empty: no held-out prompts to grade"
        return failed(STAGE, reason) if policy.require_holdout else skipped(STAGE, reason)
    budget = min(policy.reward_max_new_tokens, spec.max_completion_tokens)
    prompts, items = [r.prompt for r in rows], [r.item for r in rows]
    m = models()
    key = (f"reward:{base_sha}:{hashlib.sha256(Path(holdout_path).read_bytes()).hexdigest()}:"
           f"{_digest(spec.grader)}:{policy.max_rows}:{budget}")
    cached = cache.get(key)
    if cached is None:
        answers = m.generate(Side.BASE, prompts, budget)
        rewards, errors = grade(grader, answers, items, grader_settings)
        base = BaseSide(answers=answers, rewards=rewards, errors=errors)
        cache.put(key, base.model_dump(mode="json"))
    else:
        base = BaseSide.model_validate(cached)
    answers = m.generate(Side.CANDIDATE, prompts, budget)
    rewards, errors = grade(grader, answers, items, grader_settings)
    result = decide_reward(RewardScores(grader=f"{grader.name} ({grader.type})", base=base.rewards,
                                        candidate=rewards, base_errors=base.errors, candidate_errors=errors),
                           policy)
    examples = [{"prompt": r.question[:200], "base": b[:200], "candidate": c[:200], "base_reward": br,
                 "candidate_reward": cr}
                for r, b, c, br, cr in list(zip(rows, base.answers, answers, base.rewards, rewards))[:3]]
    return with_details(result, base_cached=cached is not None, completion_budget=budget, examples=examples)
