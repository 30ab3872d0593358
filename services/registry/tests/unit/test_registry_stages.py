import pytest

from whetstone.registry.domain import stages as S

pytestmark = pytest.mark.unit


def test_model_id_is_stable_per_job():
    assert S.model_id_for("ftjob-1") == S.model_id_for("ftjob-1") != S.model_id_for("ftjob-2")


def test_model_name_carries_base_tenant_and_job():
    assert S.model_name("org/Llama-3-8B", "acme", "ftjob-0123456789abcdef") == "ft:Llama-3-8B:acme:89abcdef"


def test_eval_verdict_decides_the_stage():
    assert S.stage_after_eval("passed") == "staging"
    assert S.stage_after_eval("failed") == "quarantined"


def test_promotion_rules():
    assert S.can_promote("dev", "staging") and S.can_promote("staging", "production")
    assert not S.can_promote("quarantined", "production")
    assert not S.can_promote("archived", "dev")
    assert not S.can_promote("dev", "production")  # no skipping staging
