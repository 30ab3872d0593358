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
    assert templates.split_body({"name": "t", "model": "m", "description": "d"}) == templates.TemplateBody(
        "t", "d", {"model": "m"})
    for body, param in (({"name": "t", "model": "m", "training_file": "f"}, "training_file"),
                        ({"name": "t", "model": "m", "colour": 1}, "colour"), ({"name": "t"}, "model"),
                        ({"model": "m"}, "name"), (["not", "a", "mapping"], "body"),
                        ({"name": "t", "model": "m", "description": None}, "description")):
        with pytest.raises(templates.TemplateError) as exc:
            templates.split_body(body)
        assert exc.value.param == param


def test_a_template_checks_integrations_as_a_job_create_does():
    """An mlflow block passes where the operator configured MLflow and is refused, naming the block,
    where none is; a malformed block is refused either way (the create's own check)."""
    from whetstone.graders import GraderEnvironment
    from whetstone.runtime.errors import ApiError
    from whetstone.scheduler.entrypoints.templates import validate

    mlflow = {"type": "mlflow", "mlflow": {"experiment_name": "house"}}
    body = templates.split_body({"name": "t", "model": "m", "integrations": [mlflow]})
    assert body.fields["integrations"] == [mlflow]
    graders = GraderEnvironment()
    validate(body, graders, mlflow_configured=True)
    with pytest.raises(ApiError) as refused:
        validate(body, graders, mlflow_configured=False)
    assert refused.value.param == "integrations[0].mlflow" and refused.value.code == "integration_not_configured"
    stray = templates.split_body({"name": "t", "model": "m", "integrations": [{"type": "mlflow", "mlflow": {}}]})
    with pytest.raises(ApiError) as malformed:
        validate(stray, graders, mlflow_configured=True)
    assert malformed.value.param.startswith("integrations[0].mlflow"), malformed.value.param


def test_a_template_pins_its_trainer_image_by_digest_never_by_tag():
    pin = "ghcr.io/whetstone/trainer@sha256:" + "a" * 64
    assert templates.split_body({"name": "t", "model": "m", "image": pin}).fields == {"model": "m", "image": pin}
    assert templates.image_problem(pin) is None
    assert templates.image_problem("registry.local:5000/trainer@sha256:" + "0" * 64) is None
    tag = templates.image_problem("ghcr.io/whetstone/trainer:latest")
    assert tag is not None and "':latest' is a tag" in tag and "name@sha256:<64 hex>" in tag
    assert "not pinned by digest" in (templates.image_problem("trainer") or "")
    assert "64 lowercase hex" in (templates.image_problem("trainer@sha256:abc") or "")


def test_urls_and_event_filters():
    assert webhooks.check_url("https://example.com/hook").host == "example.com"
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
    assert not webhooks.verify("s3cret", header.split(",")[1], b'{"a":1}')                  # no t
    assert not webhooks.verify("s3cret", "t=x," + header.split(",")[1], b'{"a":1}')        # t not a number
    assert webhooks.verify("s3cret", "t=1," + header, b'{"a":1}')                          # the last t counts


def test_backoff_grows_and_attempts_run_out():
    assert [webhooks.next_delay_s(n, 2.0) for n in (1, 2, 3, 4)] == [2.0, 8.0, 32.0, 128.0]
    assert webhooks.next_delay_s(20, 2.0) == 3600.0
    assert webhooks.outcome(204, 1, 5) == "succeeded"
    assert webhooks.outcome(500, 4, 5) == "pending" and webhooks.outcome(None, 5, 5) == "failed"
    assert webhooks.outcome(302, 1, 5) == "pending"


# ------------------------------------------------------------------ where a webhook may point

INSIDE = ["http://127.0.0.1:8100/internal/keys/verify", "http://169.254.169.254/latest/meta-data/",
          "http://[::1]:8000/", "http://0x7f000001:8104/", "http://2130706433/", "http://0177.0.0.1/", "http://127.1/",
          "http://0x7f.1/", "http://10.0.0.1/", "http://172.16.5.4/", "http://192.168.1.1/", "http://100.64.0.1/",
          "http://0.0.0.0/", "http://0/", "http://224.0.0.1/", "http://240.0.0.1/", "http://255.255.255.255/",
          "http://[::ffff:127.0.0.1]/", "http://[::ffff:7f00:1]/", "http://[::127.0.0.1]/", "http://[fe80::1]/",
          "http://[fc00::1]/", "http://[fd12:3456::1]/", "http://[ff02::1]/", "http://[::]/", "http://[64:ff9b::a00:1]/",
          "http://[2002:a00:1::]/", "http://[fec0::1]/", "http://localhost:8000/", "http://LOCALHOST./",
          "http://scheduler:8100/", "http://scheduler.whetstone.svc.cluster.local/", "http://metadata.google.internal/",
          "http://printer.local/", "http://api.localhost/", "http://1.2.3.4.5/", "http://256.0.0.1/", "http://09.0.0.1/",
          "http://[fe80::1%25eth0]/", "http://%31%32%37.0.0.1/", "http://exa mple.com/", "http://bücher.example/"]


@pytest.mark.parametrize("url", INSIDE)
def test_a_webhook_may_not_point_inside(url):
    with pytest.raises(webhooks.WebhookError) as exc:
        webhooks.check_url(url)
    assert exc.value.param == "url"


def test_numeric_hosts_are_read_as_the_c_library_reads_them():
    from ipaddress import IPv4Address

    from whetstone.scheduler.domain import addresses
    for host in ("127.0.0.1", "2130706433", "0x7f000001", "0177.0.0.1", "127.1", "0x7f.0.0.1", "127.0.1", "0x7F000001"):
        assert addresses.inet_aton(host) == IPv4Address("127.0.0.1"), host
    assert addresses.inet_aton("example.com") is None and addresses.inet_aton("1e100.net") is None
    assert addresses.kind(addresses.literal("::ffff:10.0.0.1")).startswith("private")
    assert addresses.kind(addresses.literal("8.8.8.8")) is None
    assert addresses.kind(addresses.literal("2606:4700::1111")) is None


def test_public_hosts_pass_and_the_target_pins_an_address():
    from ipaddress import ip_address

    target = webhooks.check_url("https://hooks.example.com/in?x=1")
    assert (target.host, target.port, target.path, target.address) == ("hooks.example.com", 443, "/in?x=1", None)
    assert target.host_header == "hooks.example.com"
    assert target.url_to(ip_address("93.184.216.34")) == "https://93.184.216.34:443/in?x=1"
    v6 = webhooks.check_url("http://[2606:4700::1111]:8080")
    assert v6.address == ip_address("2606:4700::1111") and v6.host_header == "[2606:4700::1111]:8080"
    assert v6.url_to(v6.address) == "http://[2606:4700::1111]:8080/"
    assert webhooks.check_url("http://8.8.8.8/x").address == ip_address("8.8.8.8")


def test_resolved_addresses_are_all_judged_and_the_allow_list_is_the_operators():
    from ipaddress import ip_address

    from whetstone.scheduler.domain import addresses
    none = addresses.AllowList()
    assert addresses.pin("hooks.example.com", 443, ["93.184.216.34", "2606:4700::1111"], none) == \
        ip_address("93.184.216.34")
    for answer in (["127.0.0.1"], ["93.184.216.34", "10.0.0.7"], ["::ffff:169.254.169.254"], [], ["not-an-ip"]):
        with pytest.raises(addresses.AddressError) as exc:
            addresses.pin("hooks.example.com", 443, answer, none)
        assert "10.0.0.7" not in exc.value.reason     # a resolved internal address is never named back
    loop = addresses.AllowList.parse(["127.0.0.1:9", "receiver.test", "[::1]:7", "10.9.0.0/16"])
    assert webhooks.check_url("http://127.0.0.1:9/hook", loop).address == ip_address("127.0.0.1")
    assert webhooks.check_url("http://[::1]:7/hook", loop).address == ip_address("::1")
    assert webhooks.check_url("http://10.9.3.4/hook", loop).address == ip_address("10.9.3.4")
    assert addresses.pin("hooks.example.com", 9, ["127.0.0.1"], loop) == ip_address("127.0.0.1")
    for url in ("http://127.0.0.2:9/hook", "http://127.0.0.1:8100/hook", "http://0x7f000001:8100/", "http://[::1]:8/"):
        with pytest.raises(webhooks.WebhookError):
            webhooks.check_url(url, loop)           # the allow-list names 127.0.0.1:9 and [::1]:7 only
    assert addresses.pin("receiver.test", 80, ["127.0.0.5"], loop) == ip_address("127.0.0.5")   # an allowed name
    with pytest.raises(addresses.AddressError):
        addresses.pin("hooks.example.com", 9, ["127.0.0.2"], loop)


def test_only_a_status_class_is_told():
    assert [webhooks.status_class(c) for c in (200, 302, 404, 503, None)] == \
        ["HTTP 2xx", "HTTP 3xx", "HTTP 4xx", "HTTP 5xx", "HTTP ?"]


# ------------------------------------------------------------------ no parser bombs

def yaml_bomb(levels: int) -> str:
    """The billion-laughs shape: each level names the previous one nine times (a few hundred bytes)."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "name: bomb\nmodel: tiny-llama\neval_config:\n" + "\n".join("  " + x for x in lines) + "\n"


def test_templates_refuse_aliases_tags_depth_and_size_before_building_anything():
    import time

    from whetstone.runtime.errors import ApiError
    from whetstone.scheduler.entrypoints.templates import MAX_BODY, parse_body

    ok = "name: t\nmodel: m\nmethod: {type: supervised, supervised: {hyperparameters: {n_epochs: 2}}}\nsuffix: 'x'\n"
    assert parse_body(ok.encode(), "application/yaml")["method"]["supervised"]["hyperparameters"] == {"n_epochs": 2}
    started = time.perf_counter()
    cases = [(yaml_bomb(9), "aliases"), ("name: t\nmodel: &m x\n", "aliases"),
             ("name: !!python/object/apply:os.system [ls]\n", "tags"), ("a: !custom 1\n", "tags"),
             ("a: " + "[" * 30 + "]" * 30 + "\n", "levels"), ("[" * 30000 + "]" * 30000, "levels"),
             ("\n".join(f"k{i}: [1, 2, 3, 4]" for i in range(1200)), "values")]
    for text, word in cases:
        with pytest.raises(ApiError) as exc:
            parse_body(text.encode(), "application/yaml")
        assert exc.value.status == 400 and exc.value.param == "body" and word in str(exc.value), (text[:40], exc.value)
    assert time.perf_counter() - started < 2.0            # refused while reading, before anything is built
    with pytest.raises(ApiError) as exc:
        parse_body(b"[" * 30000 + b"]" * 30000, "application/json")
    assert exc.value.status == 400
    with pytest.raises(ApiError) as exc:
        parse_body(b"a: 1\n" * (MAX_BODY // 5 + 1), "application/yaml")
    assert exc.value.status == 413
