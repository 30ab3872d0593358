"""A reinforcement job's held-out stage: the decision (pure) and the stage with the real grader engine
on completions from a stand-in for the models (the generation itself is the eval service's, tested
with a real model in the integration tests)."""

import json

import pytest
from whetstone.contracts import ReinforcementSpec
from whetstone.eval.domain.policy import GatePolicy, HoldoutPolicy, resolve_policy
from whetstone.eval.domain.reward import RewardScores, decide_reward
from whetstone.eval.domain.stages import verdict
from whetstone.eval.usecases.pipeline import Candidate, GateTools, run_gate
from whetstone.eval.usecases.rft import reward_stage
from whetstone.graders.rft import parse_method

pytestmark = pytest.mark.unit
P = HoldoutPolicy()
GRADER = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}",
          "reference": "{{item.answer}}", "operation": "eq"}
SPEC = ReinforcementSpec(**{**parse_method({"grader": GRADER}).record(), "max_completion_tokens": 64})


def test_reward_decision_needs_the_margin_over_the_base():
    ok = decide_reward(RewardScores("exact (string_check)", [0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]), P)
    assert ok.status == "passed" and ok.metrics[0].name == "holdout_reward"
    assert (ok.metrics[0].base, ok.metrics[0].candidate) == (0.25, 0.75) and "+0.5000 >= margin" in ok.reason
    same = decide_reward(RewardScores("exact (string_check)", [0.5, 0.5], [0.52, 0.52]), P)
    assert same.status == "failed" and "does not beat the base's 0.5000 by the margin 0.05" in same.reason
    worse = decide_reward(RewardScores("exact (string_check)", [1.0, 1.0], [0.0, 1.0], candidate_errors=1), P)
    assert worse.status == "failed" and "quarantined" in worse.reason and "1 candidate completion(s)" in worse.reason
    assert verdict([worse])[0] == "failed"
    loose = decide_reward(RewardScores("g", [0.5], [0.52]), HoldoutPolicy(min_reward_gain=0.0))
    assert loose.status == "passed"
    assert decide_reward(RewardScores("g", [], []), P).status == "failed"


def test_the_margin_is_an_eval_config_setting():
    assert resolve_policy({"stages": {"holdout": {"min_reward_gain": 0.2}}}).holdout.min_reward_gain == 0.2


class MemoryCache:
    """The gate's ScoreCache in a dict."""

    def __init__(self):
        self.values = {}

    def get(self, key):
        return self.values.get(key)

    def put(self, key, value):
        self.values[key] = value


class Answers:
    """Stands in for the loaded models: each side answers from a table."""

    def __init__(self, base: dict[str, str], candidate: dict[str, str]):
        self.tables, self.calls = {"base": base, "candidate": candidate}, []

    def generate(self, which, conversations, max_new_tokens=32, batch_size=16):
        self.calls.append((which, max_new_tokens))
        return [self.tables[which].get(c[-1].content, "?") for c in conversations]


def rows(n: int = 8) -> list[dict]:
    return [{"messages": [{"role": "system", "content": "Answer with a number."},
                          {"role": "user", "content": f"{i} + {i}?"}], "answer": str(2 * i)} for i in range(n)]


def write(path, items) -> object:
    path.write_text("".join(json.dumps(r) + "\n" for r in items))
    return path


def test_the_stage_grades_both_sides_with_the_jobs_grader_and_caches_the_base(tmp_path):
    holdout = write(tmp_path / "val.jsonl", rows())
    right = {f"{i} + {i}?": str(2 * i) for i in range(8)}
    models = Answers(base={"0 + 0?": "0"}, candidate=right)
    cache = MemoryCache()
    r = reward_stage(SPEC, holdout, "", "sha", P, cache, lambda: models)
    assert r.status == "passed", r.reason
    assert (r.metrics[0].base, r.metrics[0].candidate) == (0.125, 1.0) and r.details["grader"] == "exact (string_check)"
    assert models.calls == [("base", 64), ("candidate", 64)] and not r.details["base_cached"]
    assert r.details["examples"][0]["candidate_reward"] == 1.0

    # a candidate no better than the base (its reward was wrong in training): quarantined, base from the cache
    models = Answers(base={}, candidate={"0 + 0?": "0", "1 + 1?": "3"})
    r = reward_stage(SPEC, holdout, "", "sha", P, cache, lambda: models)
    assert r.status == "failed" and "does not beat the base's 0.1250" in r.reason and "quarantined" in r.reason
    assert models.calls == [("candidate", 64)] and r.details["base_cached"]


def test_the_stage_refuses_unusable_inputs_naming_the_line(tmp_path):
    models = Answers({}, {})
    broken = rows(3)
    broken[1]["messages"].append({"role": "assistant", "content": "2"})
    r = reward_stage(SPEC, write(tmp_path / "v.jsonl", broken), "", "sha", P, MemoryCache(), lambda: models)
    assert r.status == "failed" and "line 2" in r.reason and "'assistant'" in r.reason
    r = reward_stage(SPEC.model_copy(update={"grader": {"type": "string_check"}}), write(tmp_path / "w.jsonl", rows(2)), "", "sha", P,
                     MemoryCache(), lambda: models)
    assert r.status == "failed" and "grader cannot be used" in r.reason
    r = reward_stage(SPEC, None, "the job has no validation file", "sha", P, MemoryCache(), lambda: models)
    assert r.status == "skipped" and "no held-out prompts" in r.reason
    assert models.calls == []


def test_a_reinforcement_job_runs_the_reward_stage_and_skips_the_judge(tmp_path):
    holdout = write(tmp_path / "val.jsonl", rows(4))
    models = Answers(base={}, candidate={})
    c = Candidate(job_id="j", base_dir="", base_sha="sha", adapter_dir="", holdout_path=holdout, reinforcement=SPEC)
    policy = resolve_policy({"stages": ["holdout", "judge"]})
    tools = GateTools(cache=MemoryCache(), task_dir=None, models=lambda candidate: models)
    stages = {s.name: s for s in run_gate(c, policy, tools)}
    assert stages["holdout"].details["metric"] == "reward" and stages["holdout"].status == "failed"
    assert stages["judge"].status == "skipped" and "grader" in stages["judge"].reason
    assert GatePolicy().holdout.min_reward_gain == 0.05
