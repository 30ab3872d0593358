"""Tenants, tiers, quotas, idempotency fingerprints, hyperparameter checks, the job state machine."""

import hashlib
import json

import pytest
from pydantic import BaseModel
from whetstone.contracts import Hyperparameters

from whetstone.scheduler.domain import admission as A
from whetstone.scheduler.domain import jobs as J
from whetstone.scheduler.domain.admission import Quota, QuotaVerdict, Usage, check_estimate, check_submission

pytestmark = pytest.mark.unit
TENANTS = {"acme": "premium", "demo": "standard", "hobbyist": "free"}


def test_tier_check():
    assert J.check_tenant("demo", TENANTS, None) == "standard"
    assert J.check_tenant("demo", TENANTS, "free") == "free"             # running lower is fine
    refused = J.check_tenant("demo", TENANTS, "premium")
    assert isinstance(refused, J.Rejection) and refused.code == "tier_not_allowed" and "'standard'" in refused.message
    assert J.check_tenant("nobody", TENANTS, None).code == "unknown_tenant"


def test_concurrency_cap_and_exhausted_hard_cap_refuse_at_submission():
    quota = Quota(soft_gpu_hours=10, hard_gpu_hours=20, max_in_flight=2)
    assert check_submission(quota, Usage(0, 1)) is None
    busy = check_submission(quota, Usage(0, 2))
    assert busy.code == "concurrency_quota_exceeded" and "limit is 2" in busy.message
    spent = check_submission(quota, Usage(20.5, 0))
    assert spent.code == "hard_quota_exceeded" and "20" in spent.message
    assert check_submission(Quota(), Usage(1e9, 10_000)) is None          # no limits configured


def test_estimate_over_soft_is_flagged_over_hard_is_refused():
    quota = Quota(soft_gpu_hours=10, hard_gpu_hours=20)
    ok = check_estimate(quota, Usage(5, 0), 2)
    assert isinstance(ok, QuotaVerdict) and not ok.over_soft
    flagged = check_estimate(quota, Usage(9, 0), 2)
    assert isinstance(flagged, QuotaVerdict) and flagged.over_soft and flagged.record().over_soft_quota
    refused = check_estimate(quota, Usage(19, 0), 2)
    assert isinstance(refused, J.Rejection) and "hard cap of 20" in refused.message


def test_fingerprint_same_parameters_same_key_different_parameters_differ():
    class Request(BaseModel):
        model: str
        training_file: str
        hyperparameters: Hyperparameters
        suffix: str | None = None

    a = Request(model="m", training_file="ds-1", hyperparameters=Hyperparameters(n_epochs=3))
    b = Request(hyperparameters=Hyperparameters(n_epochs=3), training_file="ds-1", model="m")
    assert J.request_fingerprint(a) == J.request_fingerprint(b)
    assert J.request_fingerprint(a) != J.request_fingerprint(a.model_copy(update={"hyperparameters": Hyperparameters(
        n_epochs=4)}))
    # the set fields as sorted JSON: unset ones are left out (stored fingerprints keep matching)
    as_json = json.dumps({"model": "m", "training_file": "ds-1", "hyperparameters": {"n_epochs": 3}}, sort_keys=True)
    assert J.request_fingerprint(a) == hashlib.sha256(as_json.encode()).hexdigest()


@pytest.mark.parametrize("method,given,code", [
    ("full", {"lora_r": 8}, "hyperparameter_out_of_range"),
    ("lora", {"lora_r": 512}, "hyperparameter_out_of_range"),
    ("lora", {"max_seq_len": 8192}, "hyperparameter_out_of_range"),
    ("lora", {"lora_r": 64, "max_seq_len": 2048}, None),
    ("full", {"learning_rate": 1e-5}, None),
])
def test_hyperparameters_checked_against_method_and_model(method, given, code):
    refused = J.check_hyperparameters(method, Hyperparameters(**given), hidden_size=256, max_positions=4096)
    assert (refused.code if refused else None) == code


def test_hyperparameter_defaults_and_hash():
    hp, digest = J.resolve_hyperparameters("lora", Hyperparameters(lora_r=8))
    assert hp.lora_alpha == 16 and hp.learning_rate == 2e-4 and len(digest) == 64
    assert J.resolve_hyperparameters("lora", Hyperparameters(lora_r=8))[1] == digest
    # the lineage hash is the sha256 of the set knobs as sorted JSON (jobs hashed before keep their hash)
    knobs = {"n_epochs": 3, "batch_size": 8, "gradient_accumulation_steps": 1, "max_seq_len": 2048,
             "warmup_ratio": 0.03, "seed": 42, "checkpoint_every_steps": 50, "learning_rate": 2e-4, "lora_r": 8,
             "lora_dropout": 0.05, "lora_alpha": 16}
    assert digest == hashlib.sha256(json.dumps(knobs, sort_keys=True).encode()).hexdigest()
    assert J.default_learning_rate("dpo") == 5e-6 and J.default_learning_rate("merge") is None


def test_state_machine():
    assert J.transition(J.RUNNING, J.PREEMPTED) == J.PREEMPTED
    assert J.can_transition(J.PREEMPTED, J.QUEUED)
    for terminal in J.TERMINAL:
        assert not any(J.can_transition(terminal, t) for t in J.TRANSITIONS)
    assert not J.can_transition(J.FAILED, J.QUEUED)                      # failed is never re-queued
    assert J.transition(J.EVALUATING, J.CANCELLED) == J.CANCELLED       # cancel wins before succeeded
    with pytest.raises(J.InvalidTransition):
        J.transition(J.SUCCEEDED, J.CANCELLED)


def test_method_must_fit_dataset_purpose():
    assert J.check_method_fits_dataset("lora", "sft") is None
    assert J.check_method_fits_dataset("dpo", "sft").code == "method_dataset_mismatch"
    # the detected schema decides over the declared purpose, and the refusal names the field
    refusal = J.check_method_fits_dataset("dpo", "dpo", "chat", "ds-1")
    assert refusal.param == "training_file" and "preference" in refusal.message and "ds-1" in refusal.message
    assert J.check_method_fits_dataset("lora", "sft", "preference").code == "method_dataset_mismatch"
    assert J.check_method_fits_dataset("orpo", "dpo", "preference") is None


def test_defaults_fit_the_model_and_limits_name_the_hyperparameter():
    none = Hyperparameters()
    assert J.resolve_hyperparameters("lora", none, J.model_defaults(1024))[0].max_seq_len == 1024
    assert J.resolve_hyperparameters("lora", none, J.model_defaults(8192))[0].max_seq_len == 2048
    assert J.resolve_hyperparameters("lora", Hyperparameters(max_seq_len=256), J.model_defaults(1024))[0].max_seq_len \
        == 256
    too_long = J.check_hyperparameters("lora", Hyperparameters(max_seq_len=4096), 64, 1024)
    assert too_long.param == "hyperparameters.max_seq_len" and "1024" in too_long.message
    assert J.check_hyperparameters("lora", Hyperparameters(lora_r=128), 64, 1024).param == "hyperparameters.lora_r"


def test_job_usage_counts_each_gpu_second_once_whatever_the_order():
    seg1, seg2, total = (1800.0, 1.0), (7200.0, 10.0), (9000.0, 11.0)

    def replay(steps):
        u, added = A.JobUsage(), [0.0, 0.0]
        for kind, (s, c) in steps:
            after = u.with_total(s, c) if kind == "job" else u.with_segment(s, c)
            ds, dc = A.usage_delta(u, after)
            u, added = after, [added[0] + ds, added[1] + dc]
        return tuple(added)

    orders = [[("seg", seg1), ("seg", seg2), ("job", total)],
              [("job", total), ("seg", seg1), ("seg", seg2)],
              [("seg", seg1), ("job", total), ("seg", seg2)]]
    for steps in orders:
        assert replay(steps) == pytest.approx(total), steps
    # a total alone (metering never said anything per segment) counts in full
    assert replay([("job", total)]) == pytest.approx(total)
    # a correction after the close: reversal of segment 2, then its new charge
    assert replay(orders[0] + [("seg", (-7200.0, -10.0)), ("seg", (3600.0, 5.0))]) == pytest.approx((5400.0, 6.0))
