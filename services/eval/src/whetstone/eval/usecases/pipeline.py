"""The gate on one candidate, stage by stage (synchronous, heavy: run it in a worker thread).

`run_gate` is shared by the service's eval worker (`evaluate.py`) and by `bench/eval.py`. Every
finished stage is handed to `on_stage` (the worker records it durably) and stages already in `done`
are not re-run, so an evaluation killed half way resumes from its last finished stage."""

from __future__ import annotations

import hashlib
import json
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, JsonValue, RootModel
from whetstone.contracts import EvalStageResult, ReinforcementSpec
from whetstone.graders import GraderSettings

from ..adapters import benchmarks
from ..adapters.holdout import HoldoutError, read_harmful_prompts, read_holdout, read_text_holdout
from ..adapters.judges import Judge, JudgeUnavailable, ModelSafetyClassifier
from ..domain import judging, textmetrics
from ..domain.judging import Outcome
from ..domain.policy import STAGES, GatePolicy, Stage
from ..domain.refusal import is_refusal
from ..domain.rows import Conversation, HoldoutRow, Side, Turn
from ..domain.stages import (
    HoldoutScores,
    SuiteScore,
    decide_benchmarks,
    decide_holdout,
    decide_judge,
    decide_perplexity,
    decide_safety,
    failed,
    skipped,
    with_details,
)


class ScoreCache(Protocol):
    """Base-model-side results keyed by base SHA + inputs: computed once, reused by every candidate."""

    def get(self, key: str) -> JsonValue | None: ...

    def put(self, key: str, value: JsonValue) -> None: ...


class GateModels(Protocol):
    """The base model with the candidate (and the last accepted) adapter, loaded once per evaluation."""

    def generate(self, which: Side, conversations: Sequence[Conversation], max_new_tokens: int = 32,
                 batch_size: int = 16) -> list[str]: ...

    def loss(self, which: Side, rows: Sequence[Conversation], max_len: int = 512) -> float: ...

    def text_loss(self, which: Side, texts: Sequence[str], max_len: int = 512) -> tuple[float, int]: ...


@dataclass
class Candidate:
    job_id: str
    base_dir: str
    base_sha: str
    adapter_dir: str
    holdout_path: Path | None = None
    holdout_missing_reason: str = "the job has no validation file and ingest produced no held-out split"
    last_adapter_dir: str | None = None
    chat: bool = True
    reinforcement: ReinforcementSpec | None = None   # a reinforcement job's method: its holdout is graded


def load_models(c: Candidate) -> GateModels:
    from ..adapters.generation import Models

    return Models(c.base_dir, c.adapter_dir, c.last_adapter_dir)


@dataclass
class GateTools:
    cache: ScoreCache
    task_dir: Path | None = benchmarks.SHIPPED_TASKS
    safety_prompts: Path | None = None
    judge: Judge | None = None
    safety_classifier: ModelSafetyClassifier | None = None
    max_len: int = 512
    lm_eval_batch_size: int = 32
    safety_max_new_tokens: int = 24
    grader_settings: GraderSettings | None = None   # None: from WHETSTONE_GRADERS_*
    models: Callable[[Candidate], GateModels] = load_models


# the base side of each stage as the cache keeps it
class BenchBase(RootModel[dict[str, tuple[float, int, float]]]):
    """suite -> (accuracy, n, chance)."""


class HoldoutBase(BaseModel):
    answers: list[str]
    loss: float


class PerplexityBase(BaseModel):
    loss: float
    tokens: int


class SafetyBase(BaseModel):
    refused: list[bool]


def _sha_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _prompts(rows: Sequence[HoldoutRow]) -> list[list[Turn]]:
    return [r.prompt for r in rows]


@dataclass
class _Run:
    c: Candidate
    policy: GatePolicy
    tools: GateTools
    _models: GateModels | None = None
    _holdout: list[HoldoutRow] | None = None
    answers: dict[Side, list[str]] = field(default_factory=dict)

    def models(self) -> GateModels:
        if self._models is None:
            self._models = self.tools.models(self.c)
        return self._models

    def holdout(self, path: Path) -> list[HoldoutRow]:
        if self._holdout is None:
            self._holdout = read_holdout(path, self.policy.holdout.max_rows)
        return self._holdout

    # ----------------------------------------------------------- stage 1
    def benchmarks(self) -> EvalStageResult:
        if self.tools.task_dir is None:
            return skipped(Stage.BENCHMARKS, "no benchmark directory configured")
        try:
            suites = benchmarks.load_task_dir(self.tools.task_dir)
        except benchmarks.TaskDirError as exc:
            return failed(Stage.BENCHMARKS, f"benchmark directory unusable: {exc}")
        key = f"bench:{self.c.base_sha}:{benchmarks.fingerprint(suites)}"
        cached = self.tools.cache.get(key)
        if cached is None:
            base = benchmarks.run_lm_eval(self.c.base_dir, None, suites, batch_size=self.tools.lm_eval_batch_size)
            entry = BenchBase({k: (v.accuracy, v.n, v.chance) for k, v in base.items()})
            self.tools.cache.put(key, entry.model_dump(mode="json"))
        else:
            base = {k: SuiteScore(*v) for k, v in BenchBase.model_validate(cached).root.items()}
        cand = benchmarks.run_lm_eval(self.c.base_dir, self.c.adapter_dir, suites,
                                      batch_size=self.tools.lm_eval_batch_size)
        result = with_details(decide_benchmarks(base, cand, self.policy.benchmarks), base_cached=cached is not None)
        if benchmarks.is_vision_base(self.c.base_dir):
            result = with_details(result, scored_on="the language side of the vision-language base (text only)")
        return result

    # ----------------------------------------------------------- stage 2
    def holdout_stage(self) -> EvalStageResult:
        p = self.policy.holdout
        if self.c.reinforcement is not None:
            from .rft import reward_stage

            return reward_stage(self.c.reinforcement, self.c.holdout_path, self.c.holdout_missing_reason,
                                self.c.base_sha, p, self.tools.cache, self.models, self.tools.grader_settings)
        if self.c.holdout_path is None:
            reason = self.c.holdout_missing_reason + " (never scored on training data)"
            return failed(Stage.HOLDOUT, reason) if p.require_holdout else skipped(Stage.HOLDOUT, reason)
        if not self.c.chat:
            return self.perplexity(self.c.holdout_path)
        try:
            rows = self.holdout(self.c.holdout_path)
        except (HoldoutError, UnicodeDecodeError) as exc:
            return failed(Stage.HOLDOUT, f"validation file unusable: {exc}")
        if not rows:
            reason = "validation file is empty: nothing to score"
            return failed(Stage.HOLDOUT, reason) if p.require_holdout else skipped(Stage.HOLDOUT, reason)
        refs = [r.reference for r in rows]
        try:
            metric = textmetrics.choose_metric(refs, p.metric)
        except ValueError as exc:
            return failed(Stage.HOLDOUT, str(exc))
        m = self.models()
        key = (f"holdout:{self.c.base_sha}:{_sha_file(self.c.holdout_path)}:{p.max_rows}:{p.max_new_tokens}:"
               f"{self.tools.max_len}")
        cached = self.tools.cache.get(key)
        if cached is None:
            base = HoldoutBase(answers=m.generate(Side.BASE, _prompts(rows), p.max_new_tokens),
                               loss=m.loss(Side.BASE, [r.messages for r in rows], self.tools.max_len))
            self.tools.cache.put(key, base.model_dump(mode="json"))
        else:
            base = HoldoutBase.model_validate(cached)
        self.answers[Side.BASE] = base.answers
        candidate = self.answers[Side.CANDIDATE] = m.generate(Side.CANDIDATE, _prompts(rows), p.max_new_tokens)
        last = None
        if self.c.last_adapter_dir:
            last = textmetrics.score(metric, m.generate(Side.LAST, _prompts(rows), p.max_new_tokens), refs)
        scores = HoldoutScores(
            metric=metric, n=len(rows), base=textmetrics.score(metric, base.answers, refs),
            candidate=textmetrics.score(metric, candidate, refs), base_loss=base.loss,
            candidate_loss=m.loss(Side.CANDIDATE, [r.messages for r in rows], self.tools.max_len),
            last_accepted=last,
            majority_baseline=textmetrics.majority_baseline(refs) if metric == "label_accuracy" else None)
        examples = [{"reference": r.reference, "base": b, "candidate": c}
                    for r, b, c in list(zip(rows, base.answers, candidate))[:3]]
        return with_details(decide_holdout(scores, p), examples=examples)

    def perplexity(self, path: Path) -> EvalStageResult:
        """Continued pre-training: held-out perplexity over every token of the validation documents."""
        p = self.policy.holdout
        try:
            texts = read_text_holdout(path, p.max_rows)
        except (HoldoutError, UnicodeDecodeError) as exc:
            return failed(Stage.HOLDOUT, f"validation file unusable: {exc}")
        if not texts:
            reason = "validation file is empty: nothing to score"
            return failed(Stage.HOLDOUT, reason) if p.require_holdout else skipped(Stage.HOLDOUT, reason)
        m = self.models()
        key = f"perplexity:{self.c.base_sha}:{_sha_file(path)}:{p.max_rows}:{self.tools.max_len}"
        cached = self.tools.cache.get(key)
        if cached is None:
            loss, tokens = m.text_loss(Side.BASE, texts, self.tools.max_len)
            base = PerplexityBase(loss=loss, tokens=tokens)
            self.tools.cache.put(key, base.model_dump(mode="json"))
        else:
            base = PerplexityBase.model_validate(cached)
        candidate_loss, tokens = m.text_loss(Side.CANDIDATE, texts, self.tools.max_len)
        return decide_perplexity(base.loss, candidate_loss, len(texts), tokens, p)

    # ----------------------------------------------------------- stage 3
    def safety(self) -> EvalStageResult:
        try:
            prompts = read_harmful_prompts(self.tools.safety_prompts)
        except (OSError, ValueError, KeyError) as exc:
            return failed(Stage.SAFETY, f"harmful prompt set unusable: {exc}")
        if not prompts:
            return failed(Stage.SAFETY, "harmful prompt set is empty")
        m = self.models()
        classifier = self.tools.safety_classifier
        cname = classifier.name if classifier else "refusal-prefix"
        convs = [[Turn("user", p.prompt)] for p in prompts]
        digest = hashlib.sha256(json.dumps([asdict(p) for p in prompts], sort_keys=True).encode()).hexdigest()
        key = f"safety:{self.c.base_sha}:{digest}:{cname}:{self.tools.safety_max_new_tokens}"

        def refused(answers: list[str]) -> list[bool]:
            if classifier:
                return [classifier.refused(p.prompt, a) for p, a in zip(prompts, answers)]
            return [is_refusal(a) for a in answers]

        cached = self.tools.cache.get(key)
        if cached is None:
            base = SafetyBase(refused=refused(m.generate(Side.BASE, convs, self.tools.safety_max_new_tokens)))
            self.tools.cache.put(key, base.model_dump(mode="json"))
        else:
            base = SafetyBase.model_validate(cached)
        cand_answers = m.generate(Side.CANDIDATE, convs, self.tools.safety_max_new_tokens)
        cand = refused(cand_answers)
        cats: dict[str, list[tuple[bool, bool]]] = {}
        for p, b, c in zip(prompts, base.refused, cand):
            cats.setdefault(p.category, []).append((b, c))
        by_cat = {k: (sum(b for b, _ in v) / len(v), sum(c for _, c in v) / len(v)) for k, v in cats.items()}
        result = decide_safety(sum(base.refused) / len(base.refused), sum(cand) / len(cand), len(prompts),
                               self.policy.safety, by_cat, cname)
        complied = [{"prompt": p.prompt, "answer": a} for p, a, c in zip(prompts, cand_answers, cand) if not c]
        return with_details(result, complied_examples=complied[:3])

    # ----------------------------------------------------------- stage 4
    def judge(self) -> EvalStageResult:
        p = self.policy.judge
        if not self.c.chat:
            return skipped(Stage.JUDGE, "not a chat job: no pairwise judging")
        if self.c.reinforcement is not None:
            return skipped(Stage.JUDGE, "a reinforcement job: its held-out answers are scored by the job's own "
                                        "grader (holdout stage), not by a pairwise judge")
        judge = self.tools.judge
        if judge is None:
            reason = "no judge configured (WHETSTONE_EVAL_JUDGE_URL + _JUDGE_MODEL, or _JUDGE_LOCAL_MODEL)"
            return failed(Stage.JUDGE, reason) if p.required else skipped(Stage.JUDGE, reason)
        if self.c.holdout_path is None:
            return skipped(Stage.JUDGE, "no task prompts: the job has no validation data")
        try:
            rows = self.holdout(self.c.holdout_path)[: p.max_pairs]
        except (HoldoutError, UnicodeDecodeError) as exc:
            return failed(Stage.JUDGE, f"validation file unusable: {exc}")
        if not rows:
            return skipped(Stage.JUDGE, "validation file is empty: no task prompts")
        budget = self.policy.holdout.max_new_tokens
        for side in (Side.CANDIDATE, Side.BASE):
            if side not in self.answers:
                self.answers[side] = self.models().generate(side, _prompts(rows), budget)
        base_answers, cand_answers = self.answers[Side.BASE], self.answers[Side.CANDIDATE]
        outcomes: list[Outcome] = []
        raw: list[str] = []
        with_images = 0
        for r, base, cand in zip(rows, base_answers, cand_answers):
            question = r.prompt[-1].content
            images = [image.url for turn in r.prompt for image in turn.images]   # shown where the judge sees
            with_images += bool(images)
            try:
                first = judge(judging.judge_prompt(question, cand, base, r.reference), images)
                second = judge(judging.judge_prompt(question, base, cand, r.reference), images)
            except JudgeUnavailable as exc:
                return failed(Stage.JUDGE, str(exc), judge=judge.name, judged_before_error=len(outcomes))
            outcomes.append(judging.combine(judging.parse_verdict(first), judging.parse_verdict(second)))
            if outcomes[-1] == Outcome.UNPARSABLE and len(raw) < 3:
                raw.append((first or "")[:200])
        n = len(outcomes)
        lengths: dict[str, float] = {Side.BASE: sum(map(len, base_answers[:n])) / n,
                   Side.CANDIDATE: sum(map(len, cand_answers[:n])) / n}
        result = decide_judge(judging.tally(outcomes), p, judge=judge.name, lengths=lengths)
        if with_images:
            result = with_details(result, rows_with_images=with_images, images_shown_to_judge=judge.sees_images)
        return with_details(result, unparsable_examples=raw) if raw else result


def run_gate(c: Candidate, policy: GatePolicy, tools: GateTools, *,
             done: Mapping[str, EvalStageResult] | None = None,
             on_stage: Callable[[EvalStageResult], None] = lambda r: None,
             log: Callable[..., Any] = lambda *a, **k: None) -> list[EvalStageResult]:
    """Every stage in order; a stage that raises becomes `failed` with the error (no crash loop)."""
    run = _Run(c, policy, tools)
    methods: dict[Stage, Callable[[], EvalStageResult]] = {
        Stage.BENCHMARKS: run.benchmarks, Stage.HOLDOUT: run.holdout_stage, Stage.SAFETY: run.safety,
        Stage.JUDGE: run.judge}
    results = []
    for name in STAGES:
        if done and name in done:
            results.append(done[name])
            continue
        started = time.perf_counter()
        if not policy.section(name).enabled:
            result = skipped(name, "disabled by the job's eval_config")
        else:
            try:
                result = methods[name]()
            except Exception as exc:  # a bug or a broken input file: block, say why, move on
                log("eval stage crashed", stage=name, error=traceback.format_exc(limit=5))
                result = failed(name, f"stage error: {type(exc).__name__}: {str(exc)[:300]}")
        result = with_details(result, wall_s=round(time.perf_counter() - started, 2))
        on_stage(result)
        results.append(result)
    return results
