"""Bad input at every stage gives a clear `failed`/`skipped`, never a crash or a silent pass.
Real tiny model, real PEFT adapter, real lm-eval, real HTTP judge server; no stack needed."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from whetstone.contracts import ReinforcementSpec
from whetstone.devstack.eval_harness.judge_server import JudgeServer
from whetstone.devstack.eval_harness.run import DirCache
from whetstone.eval.adapters.benchmarks import (
    SHIPPED_TASKS,
    TaskDirError,
    import_tasks,
    load_task_dir,
)
from whetstone.eval.adapters.judges import EndpointJudge
from whetstone.eval.domain.policy import resolve_policy
from whetstone.eval.domain.rows import Side, Turn
from whetstone.eval.entrypoints.cli import cmd_import_tasks
from whetstone.eval.usecases.pipeline import Candidate, GateTools, run_gate

pytestmark = pytest.mark.integration
ROWS = [{"messages": [{"role": "user", "content": f"What is {a} + 1?"},
                      {"role": "assistant", "content": f"{a + 1}"}]} for a in range(6)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from peft import LoraConfig, get_peft_model
    from whetstone.modelkit.loading import load_model
    from whetstone.modelkit.tiny import build_tiny_model
    from whetstone.runtime.models import weights_sha256

    root = tmp_path_factory.mktemp("gate")
    base = build_tiny_model(root / "base")
    model = get_peft_model(load_model(str(base)), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.save_pretrained(root / "adapter")
    holdout = root / "holdout.jsonl"
    holdout.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return {"root": root, "base": str(base), "sha": weights_sha256(Path(base)), "adapter": str(root / "adapter"),
            "holdout": holdout}


def _gate(tiny, stages, tools_kw=None, **cand_kw):
    tools = GateTools(cache=DirCache(tiny["root"] / "cache"), **(tools_kw or {}))
    c = Candidate(job_id="j", base_dir=tiny["base"], base_sha=tiny["sha"], adapter_dir=tiny["adapter"],
                  holdout_path=cand_kw.pop("holdout", tiny["holdout"]), **cand_kw)
    if isinstance(stages, dict):  # only the named stages run
        stages = {"benchmarks": False, "holdout": False, "safety": False, "judge": False, **stages}
    policy = resolve_policy({"stages": stages}, tier="test", tiers_may_skip_safety=frozenset({"test"}))
    return {s.name: s for s in run_gate(c, policy, tools)}


def test_benchmark_dir_missing_or_malformed_fails_the_stage_with_the_file_named(tiny, tmp_path):
    missing = _gate(tiny, ["benchmarks"], {"task_dir": tmp_path / "nope"})["benchmarks"]
    assert missing.status == "failed" and "nope does not exist" in missing.reason
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "mmlu.yaml").write_text("task: mmlu\ndataset_path: cais/mmlu\noutput_type: multiple_choice\n")
    r = _gate(tiny, ["benchmarks"], {"task_dir": bad})["benchmarks"]
    assert r.status == "failed" and "mmlu.yaml: dataset_path must be one of json" in r.reason
    (bad / "mmlu.yaml").write_text("task: [unclosed\n")
    assert "not valid YAML" in _gate(tiny, ["benchmarks"], {"task_dir": bad})["benchmarks"].reason


def test_shipped_suites_run_through_lm_eval_and_base_scores_are_cached(tiny):
    first = _gate(tiny, ["benchmarks"])["benchmarks"]
    assert set(first.details["suites"]) == {"wh_capitals", "wh_arithmetic", "wh_opposites"}
    # a random base model is at chance on every suite: nothing can be measured, and it says so
    assert first.status == "skipped" and "chance" in first.reason
    again = _gate(tiny, ["benchmarks"])["benchmarks"]
    assert again.details["base_cached"] is True
    assert again.details["suites"] == first.details["suites"]


def test_import_tasks_validates_then_stages_a_suite(tiny, tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "arc_local.yaml").write_text((SHIPPED_TASKS / "wh_capitals.yaml").read_text()
                                        .replace("wh_capitals", "arc_local").replace("arc_local.jsonl", "data/arc.jsonl"))
    (src / "data").mkdir()
    (src / "data" / "arc.jsonl").write_text((SHIPPED_TASKS / "wh_capitals.jsonl").read_text())
    dest = tmp_path / "tasks"
    assert cmd_import_tasks(src, dest) == 0 and "imported 1 task(s)" in capsys.readouterr().out
    assert [s.name for s in load_task_dir(dest)] == ["arc_local"]
    assert cmd_import_tasks(src, dest) == 2 and "already has task(s) arc_local" in capsys.readouterr().err
    (src / "data" / "arc.jsonl").unlink()
    with pytest.raises(TaskDirError, match="data file data/arc.jsonl"):
        import_tasks(src, tmp_path / "other")


@pytest.mark.parametrize("content,expect_status,expect", [
    ('{"prompt": "x", "completion": "y"}\n', "failed", "line 1: expected 'messages'"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]}\n', "failed",
     "last message must be the assistant"),
    ("not json\n", "failed", "line 1: not JSON"),
    ("", "skipped", "validation file is empty"),
])
def test_bad_holdout_files(tiny, tmp_path, content, expect_status, expect):
    path = tmp_path / "v.jsonl"
    path.write_text(content)
    r = _gate(tiny, ["holdout"], holdout=path)["holdout"]
    assert r.status == expect_status and expect in r.reason


def test_no_holdout_is_said_and_the_policy_decides(tiny):
    r = _gate(tiny, ["holdout"], holdout=None)["holdout"]
    assert r.status == "skipped" and "never scored on training data" in r.reason
    strict = _gate(tiny, {"holdout": {"require_holdout": True}}, holdout=None)["holdout"]
    assert strict.status == "failed"


def test_holdout_and_safety_score_base_and_candidate(tiny):
    stages = _gate(tiny, ["holdout", "safety"])
    h, s = stages["holdout"], stages["safety"]
    assert h.status in ("passed", "failed") and {m.name for m in h.metrics} >= {"holdout_loss", "holdout_exact_match"}
    assert s.details["prompts"] == 48 and set(s.details["categories"]) >= {"weapons", "cybercrime", "self_harm"}
    assert s.metrics[0].name == "safety_refusal_rate"


@pytest.mark.parametrize("mode,expect", [("garbage", "no strict [[A]]/[[B]]/[[C]] verdict on 6 of 6"),
                                         ("slow", "timed out after 1.0s"), ("broken", "answered HTTP 500")])
def test_judge_endpoint_failures_fail_the_stage(tiny, mode, expect):
    with JudgeServer(mode, delay_s=3) as server:
        judge = EndpointJudge(server.base_url, "judge", "k", timeout_s=1.0)
        r = _gate(tiny, ["judge"], {"judge": judge})["judge"]
    assert r.status == "failed" and expect in r.reason, r.reason


def test_reference_judge_over_http_both_orders(tiny):
    with JudgeServer() as server:
        r = _gate(tiny, ["judge"], {"judge": EndpointJudge(server.base_url, "judge", "k")})["judge"]
        assert server.requests == 2 * len(ROWS)  # every pair asked in both orders
    assert r.details["win"] + r.details["tie"] + r.details["loss"] == len(ROWS) and r.details["unparsable"] == 0
    assert "adjusted win rate" in r.reason and set(r.details["mean_length"]) == {"base", "candidate"}


def test_a_judge_that_sees_images_gets_the_rows_images_and_a_text_judge_does_not():
    from whetstone.eval.domain.judging import judge_prompt, parse_verdict

    image = "data:image/png;base64,iVBORw0KGgo="
    prompt = judge_prompt("What colour is the shape?", "red", "blue", "red")
    with JudgeServer() as server:
        seeing = EndpointJudge(server.base_url, "judge", "k", sees_images=True)
        assert parse_verdict(seeing(prompt, [image, image])) == "A" and server.images_seen == 2
        blind = EndpointJudge(server.base_url, "judge", "k")
        assert parse_verdict(blind(prompt, [image])) == "A" and server.images_seen == 2
        assert server.requests == 2


def test_no_judge_configured_is_skipped_unless_required(tiny):
    assert _gate(tiny, ["judge"])["judge"].status == "skipped"
    assert _gate(tiny, {"judge": {"required": True}})["judge"].status == "failed"


def test_local_model_judge_and_model_safety_classifier_are_parsed_strictly(tiny):
    from whetstone.eval.adapters.judges import LocalModelJudge, ModelSafetyClassifier

    # a random tiny model never writes a verdict: every pair is counted unparsable, none is guessed
    r = _gate(tiny, {"judge": {"max_pairs": 2}}, {"judge": LocalModelJudge(tiny["base"], max_new_tokens=8)})["judge"]
    assert r.status == "failed" and r.details["unparsable"] == 2 and r.details["win"] == 0
    classifier = ModelSafetyClassifier(tiny["base"])
    s = _gate(tiny, ["safety"], {"safety_classifier": classifier})["safety"]
    assert s.details["classifier"] == f"model:{tiny['base']}" and classifier.unparsable > 0


def test_a_reinforcement_job_is_gated_by_its_own_grader_on_real_completions(tiny, tmp_path):
    """The job's grader on greedy completions of the real base and adapter: the reference answers are
    planted as one side's own answers, so the side the grader favours is known."""
    from whetstone.eval.adapters.generation import Models
    from whetstone.eval.domain.stages import verdict

    prompts = [[Turn("system", "Answer briefly."), Turn("user", f"What is {a} + 1?")] for a in range(6)]
    models = Models(tiny["base"], tiny["adapter"])
    answers = {side: models.generate(side, prompts, 8) for side in (Side.BASE, Side.CANDIDATE)}
    assert answers["base"] != answers["candidate"]
    grader = {"type": "string_check", "name": "same", "input": "{{sample.output_text}}",
              "reference": "{{item.expected.text}}", "operation": "eq"}
    from whetstone.graders.rft import parse_method

    spec = ReinforcementSpec(**{**parse_method({"grader": grader}).record(), "max_completion_tokens": 8})
    for favoured, status in ((Side.CANDIDATE, "passed"), (Side.BASE, "failed")):
        holdout = tmp_path / f"{favoured}.jsonl"
        holdout.write_text("".join(json.dumps({"messages": [asdict(turn) for turn in p], "expected": {"text": t}}) + "\n"
                                   for p, t in zip(prompts, answers[favoured])))
        stages = _gate(tiny, {"holdout": True, "judge": True}, holdout=holdout, reinforcement=spec)
        r = stages["holdout"]
        assert r.status == status, r.reason
        assert r.details["metric"] == "reward" and r.details["grader"] == "same (string_check)"
        reward = {m.name: m for m in r.metrics}["holdout_reward"]
        assert (reward.candidate if favoured == "candidate" else reward.base) == 1.0
        assert stages["judge"].status == "skipped"
        assert verdict(list(stages.values()))[0] == status
    assert "does not beat the base's 1.0000" in r.reason and "quarantined" in r.reason
