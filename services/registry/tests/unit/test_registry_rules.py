import json

import pytest
import yaml

from whetstone.contracts import EvalStageResult, Metric
from whetstone.registry.domain import drift, lineage, policy
from whetstone.runtime.chat_templates import chat_template_from
from whetstone.registry.domain.drift import PinnedAdapter

pytestmark = pytest.mark.unit


def test_auto_promotion_needs_every_margin_above_threshold():
    good = [Metric(name="holdout_loss", base=2.0, candidate=1.5),
            Metric(name="accuracy", base=0.5, candidate=0.6, higher_is_better=True)]
    assert policy.auto_promotion("passed", good, [], 0.10).passed
    thin = good + [Metric(name="safety", base=1.0, candidate=0.97)]
    result = policy.auto_promotion("passed", thin, [], 0.10)
    assert not result.passed and "safety" in result.reason
    assert not policy.auto_promotion("failed", good, [], 0.10).passed
    judge = EvalStageResult(name="judge", status="failed", reason="judge preferred the base")
    assert not policy.auto_promotion("passed", good, [judge], 0.10).passed
    assert not policy.auto_promotion("passed", [Metric(name="x", candidate=1.0)], [], 0.10).passed
    regressed = [Metric(name="holdout_loss", base=2.0, candidate=1.5, last_accepted=1.4)]
    assert "regressed" in policy.auto_promotion("passed", regressed, [], 0.10).reason



def test_auto_promotion_never_cites_a_skipped_stage():
    holdout = EvalStageResult(name="holdout", status="passed", reason="better than the base",
                              metrics=[Metric(name="holdout_loss", base=2.0, candidate=1.5)])
    benchmarks = EvalStageResult(name="benchmarks", status="skipped", reason="at chance",  # must not decide or be named
                                 metrics=[Metric(name="arc_easy", base=0.25, candidate=0.26, higher_is_better=True)])
    metrics = holdout.metrics + benchmarks.metrics
    result = policy.auto_promotion("passed", metrics, [holdout, benchmarks], 0.10)
    assert result.passed and "holdout_loss" in result.reason and "arc_easy" not in result.reason
    assert "over the stages that ran (holdout)" in result.reason and "skipped: benchmarks" in result.reason


def test_rollout_blocked_until_every_production_adapter_passed_reeval():
    old, new = "a" * 64, "b" * 64
    fleet = [PinnedAdapter("m1", "acme", "n1", "production", old, "passed"),
             PinnedAdapter("m2", "demo", "n2", "production", old, "requested"),
             PinnedAdapter("m3", "demo", "n3", "production", new, None)]
    check = drift.rollout_check("base", new, old, fleet)
    assert not check.may_roll_out and check.checked == 2
    assert [b.model_id for b in check.blockers] == ["m2"] and check.blockers[0].reeval_status == "requested"
    fleet[1] = PinnedAdapter("m2", "demo", "n2", "production", old, "passed")
    assert drift.rollout_check("base", new, old, fleet).may_roll_out


def record(**over) -> lineage.LineageRecord:
    fields = dict(job_id="j1", base_model="tiny", base_model_sha256="a" * 64, dataset_id="ds-1",
                  dataset_version="b" * 64, method="lora", hyperparameters={"n_epochs": 1}, hyperparameters_hash="c" * 64,
                  training_run="j1-s1", checkpoint_step=5, job_template=None, job_template_version=None,
                  job_template_missing_reason="no templates", environment={"packages": {}}, environment_sha256="d" * 64,
                  eval_verdict="passed", eval_metrics=[Metric(name="holdout_loss", base=2.0, candidate=1.5)],
                  eval_stages=[EvalStageResult(name="holdout", status="passed", reason="better than the base",
                                               metrics=[Metric(name="holdout_loss", base=2.0, candidate=1.5)])],
                  files={"adapter_model.safetensors": "e" * 64})
    return lineage.LineageRecord(**{**fields, **over})


def test_lineage_cannot_be_incomplete():
    with pytest.raises(lineage.IncompleteLineage, match="base_model_sha256"):
        record(base_model_sha256="")
    with pytest.raises(lineage.IncompleteLineage, match="job_template"):
        record(job_template_missing_reason=None)
    with pytest.raises(lineage.IncompleteLineage, match="files"):
        record(files={})


def test_the_lineage_view_is_the_record_with_its_model_card():
    kept = record(eval_reasons=["better"])
    view = lineage.StoredLineage(kept, "s3://w/README.md").view().model_dump(mode="json")
    shown = kept.model_dump(mode="json", exclude={"eval_reasons", "vision"})
    assert list(view) == [*shown, "model_card_uri", "vision"]   # the API's field order
    assert {k: view[k] for k in shown} == shown and view["model_card_uri"] == "s3://w/README.md"


def test_model_card_front_matter():
    card = lineage.model_card("wsm-1", "ft:tiny:acme:x", "acme", record())
    front = yaml.safe_load(card.split("---")[1])
    assert front["base_model"] == "tiny" and front["datasets"] == ["ds-1"]
    result = front["model-index"][0]["results"][0]
    assert result["task"]["name"] == "holdout" and result["metrics"][0]["value"] == 1.5
    assert (front["library_name"], front["base_model_relation"]) == ("peft", "adapter")
    full = lineage.model_card("wsm-2", "ft:tiny:acme:y", "acme", record(
        method="full", files={"config.json": "c" * 64, "model.safetensors": "d" * 64}))
    front = yaml.safe_load(full.split("---")[1])
    assert (front["library_name"], front["base_model_relation"]) == ("transformers", "finetune")


def test_served_adapter_config_names_the_served_base():
    cfg = lineage.served_adapter_config({"base_model_name_or_path": "/tmp/x", "peft_type": "LORA", "r": 8}, "tiny")
    assert cfg["base_model_name_or_path"] == "tiny" and cfg["r"] == 8
    assert lineage.served_adapter_config({"base_model_name_or_path": None}, "tiny")["peft_type"] == "LORA"



def test_a_hub_base_is_written_with_the_commit_it_was_pinned_to():
    commit, weights = "a" * 40, "b" * 64
    assert lineage.hub_revision("meta-llama/Llama-3.2-1B", commit) == commit
    assert lineage.hub_revision("tiny-llama", weights) is None and lineage.hub_revision("org/x", weights) is None
    cfg = lineage.served_adapter_config({"peft_type": "LORA"}, "meta-llama/Llama-3.2-1B", commit)
    assert cfg["base_model_name_or_path"] == "meta-llama/Llama-3.2-1B" and cfg["revision"] == commit
    assert "revision" not in lineage.served_adapter_config({"peft_type": "LORA"}, "tiny-llama")


def test_chat_template_identity_and_pickles():
    assert chat_template_from({"tokenizer_config.json": json.dumps({"chat_template": "T"}).encode()}) == "T"
    assert chat_template_from({"chat_template.jinja": b"J", "tokenizer_config.json": b"{}"}) == "J"
    assert lineage.chat_template_sha256(None) is None
    assert lineage.pickles({"a.safetensors": "x", "training_args.bin": "y", "opt.pt": "z"}) == ["training_args.bin", "opt.pt"]
