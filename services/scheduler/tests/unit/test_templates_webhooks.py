"""Pure rules of job templates (references, overrides) and webhooks (URLs, filters, signature, backoff)."""

import pytest
from whetstone.scheduler.domain import templates, webhooks

pytestmark = pytest.mark.unit


def test_references_name_a_template_and_optionally_a_version():
    assert templates.parse_ref("sft-base") == templates.TemplateRef("sft-base", None)
    assert templates.parse_ref("sft-base@3") == templates.TemplateRef("sft-base", 3)
    for bad in ("sft base", "sft@", "sft@0", "sft@v2", "@3", ""):
        with pytest.raises(templates.TemplateError) as exc:
            templates.parse_ref(bad)
        assert exc.value.param == "template"


def test_overrides_merge_hyperparameters_where_the_template_keeps_them_and_are_recorded():
    tpl = {"model": "m", "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 3}}},
           "suffix": "a"}
    job, overrides = templates.apply(tpl, {"hyperparameters": {"n_epochs": 1, "batch_size": 4}, "suffix": "a",
                                           "training_file": "f"})
    assert job["method"]["supervised"]["hyperparameters"] == {"n_epochs": 1, "batch_size": 4}
    assert "hyperparameters" not in job and job["training_file"] == "f"
    assert overrides == ["hyperparameters.n_epochs"]            # same suffix: no override; new keys: none
    assert tpl["method"]["supervised"]["hyperparameters"] == {"n_epochs": 3}   # the template is untouched
    job, overrides = templates.apply(tpl, {"method": {"type": "dpo"}, "hyperparameters": {"beta": 0.2}})
    assert job["method"] == {"type": "dpo"} and job["hyperparameters"] == {"beta": 0.2} and overrides == ["method"]
    job, overrides = templates.apply({"model": "m", "hyperparameters": {"n_epochs": 2}}, {"model": "n"})
    assert job == {"model": "n", "hyperparameters": {"n_epochs": 2}} and overrides == ["model"]


def test_a_template_body_holds_how_to_train_never_what_on():
    assert templates.split_body({"name": "t", "model": "m", "description": "d"}) == ("t", {"model": "m"})
    for body, param in (({"name": "t", "model": "m", "training_file": "f"}, "training_file"),
                        ({"name": "t", "model": "m", "colour": 1}, "colour"), ({"name": "t"}, "model"),
                        ({"model": "m"}, "name"), (["not", "a", "mapping"], "body")):
        with pytest.raises(templates.TemplateError) as exc:
            templates.split_body(body)
        assert exc.value.param == param
    assert templates.template_fields({"name": "t", "version": 2, "overrides": ["suffix"]}) == {
        "job_template": "t", "job_template_version": "2", "job_template_overrides": ["suffix"]}
    assert templates.template_fields(None) == {}


def test_urls_and_event_filters():
    assert webhooks.check_url("https://example.com/hook") == "https://example.com/hook"
    for bad in ("ftp://example.com", "file:///etc/passwd", "https://user:pw@example.com/", "http:///nohost"):
        with pytest.raises(webhooks.WebhookError):
            webhooks.check_url(bad)
    assert webhooks.check_events(["job.failed", "job.failed", "job.cancelled"]) == ["job.cancelled", "job.failed"]
    with pytest.raises(webhooks.WebhookError) as exc:
        webhooks.check_events(["job.failed", "job.exploded"])
    assert exc.value.param == "events.1"


def test_signature_binds_secret_timestamp_and_body():
    header = webhooks.sign("s3cret", 1_700_000_000, b'{"a":1}')
    assert header.startswith("t=1700000000,v1=") and len(header.split("v1=")[1]) == 64
    assert webhooks.verify("s3cret", header, b'{"a":1}')
    assert not webhooks.verify("other", header, b'{"a":1}')
    assert not webhooks.verify("s3cret", header, b'{"a":2}')
    assert not webhooks.verify("s3cret", header.replace("t=1700000000", "t=1700000001"), b'{"a":1}')
    assert not webhooks.verify("s3cret", "garbage", b"")


def test_backoff_grows_and_attempts_run_out():
    assert [webhooks.next_delay_s(n, 2.0) for n in (1, 2, 3, 4)] == [2.0, 8.0, 32.0, 128.0]
    assert webhooks.next_delay_s(20, 2.0) == 3600.0
    assert webhooks.outcome(204, 1, 5) == "succeeded"
    assert webhooks.outcome(500, 4, 5) == "pending" and webhooks.outcome(None, 5, 5) == "failed"
    assert webhooks.outcome(302, 1, 5) == "pending"
