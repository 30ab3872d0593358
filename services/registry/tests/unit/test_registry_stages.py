from datetime import UTC, datetime

import pytest

from whetstone.registry.domain import stages
from whetstone.registry.domain.stages import ModelRecord, TransitionRefused

pytestmark = pytest.mark.unit


def model(model_id="m1", stage="staging", name="ft:b:acme:support", needs_reeval=False) -> ModelRecord:
    return ModelRecord(model_id=model_id, job_id="j-" + model_id, tenant_id="acme", name=name, stage=stage,
                       artifact_uri="s3://b/x", artifact_sha256="a" * 64, created_at=datetime.now(UTC),
                       needs_reeval=needs_reeval)


def test_model_id_is_stable_per_job():
    assert stages.model_id_for("ftjob-1") == stages.model_id_for("ftjob-1") != stages.model_id_for("ftjob-2")


def test_model_name_versions_share_a_suffix():
    assert stages.model_name("org/Llama-3-8B", "acme", "ftjob-0123456789abcdef") == "ft:Llama-3-8B:acme:89abcdef"
    assert stages.model_name("org/Llama-3-8B", "acme", "ftjob-1", "support") == \
        stages.model_name("org/Llama-3-8B", "acme", "ftjob-2", "support") == "ft:Llama-3-8B:acme:support"


def test_eval_verdict_decides_the_stage():
    assert stages.stage_after_eval("passed") == "staging"
    assert stages.stage_after_eval("failed") == "quarantined"


def test_promotion_rules():
    assert stages.can_promote("dev", "staging") and stages.can_promote("staging", "production")
    assert not stages.can_promote("quarantined", "production")
    assert not stages.can_promote("archived", "dev")
    assert not stages.can_promote("dev", "production")  # no skipping staging


def test_production_archives_the_replaced_version_first():
    plan = stages.plan_promotion(model("m2"), "production", "better", current_production=model("m1", "production"),
                                 approval="manual")
    assert [(t.model_id, t.from_stage, t.to_stage) for t in plan.transitions] == [
        ("m1", "production", "archived"), ("m2", "staging", "production")]
    assert plan.main.approval == "manual" and plan.main.replaces_model_id == "m1"


@pytest.mark.parametrize("m,target,approval,code", [
    (model(stage="quarantined"), "production", "manual", "model_quarantined"),
    (model(stage="quarantined"), "staging", "manual", "model_quarantined"),
    (model(), "production", None, "approval_required"),
    (model(needs_reeval=True), "production", "manual", "needs_reeval"),
    (model(stage="dev"), "production", "manual", "invalid_transition"),
    (model(stage="production"), "production", "manual", "already_in_stage"),
    (model(), "nowhere", "manual", "invalid_stage"),
])
def test_refused_promotions(m, target, approval, code):
    with pytest.raises(TransitionRefused) as exc:
        stages.plan_promotion(m, target, "r", current_production=None, approval=approval)
    assert exc.value.code == code


def test_quarantined_may_be_archived():
    assert stages.plan_promotion(model(stage="quarantined"), "archived", "r", current_production=None,
                                 approval=None).main.to_stage == "archived"


def test_rollback_swaps_current_and_previous_in_one_plan():
    plan = stages.plan_rollback(model("m2", "production"), model("m1", "archived"), "bad answers")
    assert [(t.model_id, t.to_stage) for t in plan.transitions] == [("m2", "archived"), ("m1", "production")]
    with pytest.raises(TransitionRefused, match="no previous"):
        stages.plan_rollback(model("m2", "production"), None, "r")
    with pytest.raises(TransitionRefused) as exc:
        stages.plan_rollback(model("m2", "staging"), model("m1", "archived"), "r")
    assert exc.value.code == "not_in_production"
