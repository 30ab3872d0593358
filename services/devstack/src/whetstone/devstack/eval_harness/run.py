"""Run the full gate on planted candidates (`bench/eval.py` and the integration test share this)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import JsonValue
from whetstone.contracts import EvalStageResult
from whetstone.contracts.enums import EvalVerdict, StageStatus
from whetstone.eval.adapters.judges import EndpointJudge
from whetstone.eval.domain.policy import GatePolicy
from whetstone.eval.domain.stages import verdict
from whetstone.eval.usecases.pipeline import Candidate, GateTools, run_gate

from . import data, teach


class DirCache:
    """The gate's ScoreCache in JSON files, one per key (bench and tests, single host)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / (hashlib.sha256(key.encode()).hexdigest() + ".json")

    def get(self, key: str) -> JsonValue | None:
        p = self._path(key)
        value: JsonValue = json.loads(p.read_text()) if p.is_file() else None
        return value

    def put(self, key: str, value: JsonValue) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self._path(key).with_suffix(".tmp")
        tmp.write_text(json.dumps(value))
        tmp.replace(self._path(key))


@dataclass
class Planted:
    kind: str
    seed: int
    verdict: EvalVerdict
    stages: list[EvalStageResult]
    train_s: float
    eval_s: float

    @property
    def blocked(self) -> bool:
        return self.verdict == EvalVerdict.FAILED

    @property
    def blocked_by_intended(self) -> bool:
        intended = teach.INTENDED_STAGE.get(self.kind)
        return intended is not None and any(s.name == intended and s.status == StageStatus.FAILED for s in self.stages)

    def line(self) -> str:
        marks = " ".join(f"{s.name}={s.status}" for s in self.stages)
        return f"{self.kind:<15} seed={self.seed} verdict={self.verdict:<6} {marks} train={self.train_s:.1f}s " \
               f"eval={self.eval_s:.1f}s"


class Harness:
    """A taught base (cached by recipe hash), a holdout file, a judge endpoint and a score cache."""

    def __init__(self, work: Path, cache_dir: Path, judge_url: str, log: Callable[[str], None] = print) -> None:
        self.work = Path(work)
        self.base = teach.build_taught_base(cache_dir, log=log)
        from whetstone.runtime.models import weights_sha256

        self.base_sha = weights_sha256(self.base)
        self.holdout = data.write_jsonl(self.work / "holdout.jsonl", teach.holdout_rows())
        self.tools = GateTools(cache=DirCache(Path(cache_dir) / f"scores-{self.base.name}"),
                               judge=EndpointJudge(judge_url, "reference-judge", "test-key", timeout_s=10))

    def plant(self, kind: str, seed: int, policy: GatePolicy = GatePolicy()) -> Planted:
        adapter = self.work / f"{kind}-{seed}"
        started = time.perf_counter()
        teach.train_candidate(self.base, kind, seed, adapter)
        train_s = time.perf_counter() - started
        started = time.perf_counter()
        stages = run_gate(Candidate(job_id=f"{kind}-{seed}", base_dir=str(self.base), base_sha=self.base_sha,
                                    adapter_dir=str(adapter), holdout_path=self.holdout), policy, self.tools)
        return Planted(kind, seed, verdict(stages)[0], stages, train_s, time.perf_counter() - started)
