"""The gate on one candidate, stage by stage (synchronous, heavy: run it in a worker thread).

`run_gate` is shared by the service's eval worker and by `bench/eval.py`. Every finished stage is
handed to `on_stage` (the worker records it durably) and stages already in `done` are not re-run,
so an evaluation killed half way resumes from its last finished stage."""

from __future__ import annotations

import hashlib
import json
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from whetstone.contracts import EvalStageResult

from ..adapters import benchmarks
from ..adapters.holdout import HoldoutError, HoldoutRow, read_harmful_prompts, read_holdout
from ..adapters.judges import Judge, JudgeUnavailable, ModelSafetyClassifier
from ..domain import judging, textmetrics
from ..domain.policy import STAGES, GatePolicy
from ..domain.refusal import is_refusal
from ..domain.stages import HoldoutScores, SuiteScore, decide_benchmarks, decide_holdout, decide_judge, decide_safety
from ..domain.stages import failed as failed_stage
from ..domain.stages import skipped as skipped_stage


class ScoreCache(Protocol):
    """Base-model-side results keyed by base SHA + inputs: computed once, reused by every candidate."""

    def get(self, key: str) -> dict | None: ...

    def put(self, key: str, value: dict) -> None: ...


class DirCache:
    """A ScoreCache in JSON files (bench, single host)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / (hashlib.sha256(key.encode()).hexdigest() + ".json")

    def get(self, key: str) -> dict | None:
        p = self._path(key)
        return json.loads(p.read_text()) if p.is_file() else None

    def put(self, key: str, value: dict) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self._path(key).with_suffix(".tmp")
        tmp.write_text(json.dumps(value))
        tmp.replace(self._path(key))


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
    reinforcement: dict | None = None       # a reinforcement job's method (grader, knobs): its holdout is graded


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
    grader_settings: Any = None             # whetstone.graders.GraderSettings (None: from WHETSTONE_GRADERS_*)


def _sha_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass
class _Run:
    c: Candidate
    policy: GatePolicy
    tools: GateTools
    _models: Any = None
    _holdout: list[HoldoutRow] | None = None
    answers: dict[str, list[str]] = field(default_factory=dict)

    def models(self):
        if self._models is None:
            from ..adapters.generation import Models

            self._models = Models(self.c.base_dir, self.c.adapter_dir, self.c.last_adapter_dir)
        return self._models

    def holdout(self) -> list[HoldoutRow]:
        if self._holdout is None:
            self._holdout = read_holdout(self.c.holdout_path, self.policy.holdout.max_rows)
        return self._holdout

    # ----------------------------------------------------------- stage 1
    def benchmarks(self) -> EvalStageResult:
        if self.tools.task_dir is None:
            return skipped_stage("benchmarks", "no benchmark directory configured")
        try:
            suites = benchmarks.load_task_dir(self.tools.task_dir)
        except benchmarks.TaskDirError as exc:
            return failed_stage("benchmarks", f"benchmark directory unusable: {exc}")
        key = f"bench:{self.c.base_sha}:{benchmarks.fingerprint(suites)}"
        cached = self.tools.cache.get(key)
        if cached is None:
            base = benchmarks.run_lm_eval(self.c.base_dir, None, suites, batch_size=self.tools.lm_eval_batch_size)
            self.tools.cache.put(key, {k: [v.accuracy, v.n, v.chance] for k, v in base.items()})
        else:
            base = {k: SuiteScore(*v) for k, v in cached.items()}
        cand = benchmarks.run_lm_eval(self.c.base_dir, self.c.adapter_dir, suites,
                                      batch_size=self.tools.lm_eval_batch_size)
        result = decide_benchmarks(base, cand, self.policy.benchmarks)
        result.details["base_cached"] = cached is not None
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
            return failed_stage("holdout", reason) if p.require_holdout else skipped_stage("holdout", reason)
        try:
            rows = self.holdout()
        except (HoldoutError, UnicodeDecodeError) as exc:
            return failed_stage("holdout", f"validation file unusable: {exc}")
        if not rows:
            reason = "validation file is empty: nothing to score"
            return failed_stage("holdout", reason) if p.require_holdout else skipped_stage("holdout", reason)
        refs = [r.reference for r in rows]
        try:
            metric = textmetrics.choose_metric(refs, p.metric)
        except ValueError as exc:
            return failed_stage("holdout", str(exc))
        m = self.models()
        key = f"holdout:{self.c.base_sha}:{_sha_file(self.c.holdout_path)}:{p.max_rows}:{p.max_new_tokens}:{self.tools.max_len}"
        cached = self.tools.cache.get(key)
        if cached is None:
            cached = {"answers": m.generate("base", [r.prompt for r in rows], p.max_new_tokens),
                      "loss": m.loss("base", [r.messages for r in rows], self.tools.max_len)["loss"]}
            self.tools.cache.put(key, cached)
        self.answers["base"] = cached["answers"]
        self.answers["candidate"] = m.generate("candidate", [r.prompt for r in rows], p.max_new_tokens)
        cand_loss = m.loss("candidate", [r.messages for r in rows], self.tools.max_len)["loss"]
        last = None
        if self.c.last_adapter_dir:
            last = textmetrics.score(metric, m.generate("last", [r.prompt for r in rows], p.max_new_tokens), refs)
        scores = HoldoutScores(
            metric=metric, n=len(rows), base=textmetrics.score(metric, cached["answers"], refs),
            candidate=textmetrics.score(metric, self.answers["candidate"], refs), base_loss=cached["loss"],
            candidate_loss=cand_loss, last_accepted=last,
            majority_baseline=textmetrics.majority_baseline(refs) if metric == "label_accuracy" else None)
        result = decide_holdout(scores, p)
        result.details["examples"] = [{"reference": r.reference, "base": b, "candidate": c}
                                      for r, b, c in list(zip(rows, self.answers["base"], self.answers["candidate"]))[:3]]
        return result

    # ----------------------------------------------------------- stage 3
    def safety(self) -> EvalStageResult:
        try:
            prompts = read_harmful_prompts(self.tools.safety_prompts)
        except (OSError, ValueError, KeyError) as exc:
            return failed_stage("safety", f"harmful prompt set unusable: {exc}")
        if not prompts:
            return failed_stage("safety", "harmful prompt set is empty")
        m = self.models()
        classifier = self.tools.safety_classifier
        cname = classifier.name if classifier else "refusal-prefix"
        convs = [[{"role": "user", "content": p["prompt"]}] for p in prompts]
        digest = hashlib.sha256(json.dumps(prompts, sort_keys=True).encode()).hexdigest()
        key = f"safety:{self.c.base_sha}:{digest}:{cname}:{self.tools.safety_max_new_tokens}"

        def judge(answers: list[str]) -> list[bool]:
            if classifier:
                return [classifier.refused(p["prompt"], a) for p, a in zip(prompts, answers)]
            return [is_refusal(a) for a in answers]

        cached = self.tools.cache.get(key)
        if cached is None:
            answers = m.generate("base", convs, self.tools.safety_max_new_tokens)
            cached = {"refused": judge(answers)}
            self.tools.cache.put(key, cached)
        cand_answers = m.generate("candidate", convs, self.tools.safety_max_new_tokens)
        cand = judge(cand_answers)
        base = cached["refused"]
        cats: dict[str, list[tuple[bool, bool]]] = {}
        for p, b, c in zip(prompts, base, cand):
            cats.setdefault(p["category"], []).append((b, c))
        by_cat = {k: (sum(b for b, _ in v) / len(v), sum(c for _, c in v) / len(v)) for k, v in cats.items()}
        result = decide_safety(sum(base) / len(base), sum(cand) / len(cand), len(prompts), self.policy.safety,
                               by_cat, cname)
        complied = [{"prompt": p["prompt"], "answer": a} for p, a, c in zip(prompts, cand_answers, cand) if not c]
        result.details["complied_examples"] = complied[:3]
        return result

    # ----------------------------------------------------------- stage 4
    def judge(self) -> EvalStageResult:
        p = self.policy.judge
        if not self.c.chat:
            return skipped_stage("judge", "not a chat job: no pairwise judging")
        if self.c.reinforcement is not None:
            return skipped_stage("judge", "a reinforcement job: its held-out answers are scored by the job's own "
                                          "grader (holdout stage), not by a pairwise judge")
        if self.tools.judge is None:
            reason = "no judge configured (WHETSTONE_EVAL_JUDGE_URL + _JUDGE_MODEL, or _JUDGE_LOCAL_MODEL)"
            return failed_stage("judge", reason) if p.required else skipped_stage("judge", reason)
        if self.c.holdout_path is None:
            return skipped_stage("judge", "no task prompts: the job has no validation data")
        try:
            rows = self.holdout()[: p.max_pairs]
        except (HoldoutError, UnicodeDecodeError) as exc:
            return failed_stage("judge", f"validation file unusable: {exc}")
        if not rows:
            return skipped_stage("judge", "validation file is empty: no task prompts")
        hp = self.policy.holdout
        if "candidate" not in self.answers:
            self.answers["candidate"] = self.models().generate("candidate", [r.prompt for r in rows], hp.max_new_tokens)
        if "base" not in self.answers:
            self.answers["base"] = self.models().generate("base", [r.prompt for r in rows], hp.max_new_tokens)
        outcomes, raw = [], []
        for r, base, cand in zip(rows, self.answers["base"], self.answers["candidate"]):
            question = r.prompt[-1]["content"]
            try:
                first = self.tools.judge(judging.judge_prompt(question, cand, base, r.reference))
                second = self.tools.judge(judging.judge_prompt(question, base, cand, r.reference))
            except JudgeUnavailable as exc:
                return failed_stage("judge", str(exc), judge=self.tools.judge.name, judged_before_error=len(outcomes))
            outcomes.append(judging.combine(judging.parse_verdict(first), judging.parse_verdict(second)))
            if outcomes[-1] == "unparsable" and len(raw) < 3:
                raw.append((first or "")[:200])
        n = len(outcomes)
        lengths = {"base": sum(map(len, self.answers["base"][:n])) / n,
                   "candidate": sum(map(len, self.answers["candidate"][:n])) / n}
        result = decide_judge(judging.tally(outcomes), p, judge=self.tools.judge.name, lengths=lengths)
        if raw:
            result.details["unparsable_examples"] = raw
        return result


def run_gate(c: Candidate, policy: GatePolicy, tools: GateTools, *,
             done: Mapping[str, EvalStageResult] | None = None,
             on_stage: Callable[[EvalStageResult], None] = lambda r: None,
             log: Callable[..., None] = lambda *a, **k: None) -> list[EvalStageResult]:
    """Every stage in order; a stage that raises becomes `failed` with the error (no crash loop)."""
    run = _Run(c, policy, tools)
    methods = {"benchmarks": run.benchmarks, "holdout": run.holdout_stage, "safety": run.safety, "judge": run.judge}
    results = []
    for name in STAGES:
        if done and name in done:
            results.append(done[name])
            continue
        started = time.perf_counter()
        if not getattr(policy, name).enabled:
            result = skipped_stage(name, "disabled by the job's eval_config")
        else:
            try:
                result = methods[name]()
            except Exception as exc:  # a bug or a broken input file: block, say why, move on
                log("eval stage crashed", stage=name, error=traceback.format_exc(limit=5))
                result = failed_stage(name, f"stage error: {type(exc).__name__}: {str(exc)[:300]}")
        result.details["wall_s"] = round(time.perf_counter() - started, 2)
        on_stage(result)
        results.append(result)
    return results
