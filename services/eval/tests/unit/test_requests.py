import pytest
from whetstone.eval.domain.requests import base_mismatch, request_run_id

pytestmark = pytest.mark.unit


def test_a_request_has_its_own_run_key_per_tenant():
    assert request_run_id("acme", "reeval-m1-abc") == "request:acme:reeval-m1-abc"
    assert request_run_id("acme", "r") != request_run_id("other", "r")
    assert request_run_id("acme", "job-1") != "job-1"   # never the key of the job's own evaluation


def test_base_mismatch_names_both_shas_or_is_none():
    assert base_mismatch("tiny", "a" * 64, "a" * 64, "catalog") is None
    reason = base_mismatch("tiny", "a" * 64, "b" * 64, "the local catalog")
    assert reason == ("base model tiny: the weights at the local catalog have sha256 bbbbbbbbbbbb, not the pinned "
                      "aaaaaaaaaaaa; not evaluating against other weights")
    assert "sha256 ?," in base_mismatch("tiny", "a" * 64, "", "the Hub")
