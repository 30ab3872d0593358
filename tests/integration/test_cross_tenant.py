"""Cross-tenant attack: no tenant can act as another, on HTTP or on Kafka.

One platform (every service and the public gateway). Tenant A fine-tunes a tiny model, so A owns a
file, a job with checkpoints, a registered model, usage, a template, a webhook, a serving route and
keys. Then every route in the services' own route tables (not a hand list: a new route is attacked
automatically, and fails the test until it is refused or listed in an exemption table below) is tried
(a) with tenant B's all-scopes key on A's object ids, (b) on the service's own port with a forged
identity header, (c) with a revoked key, (d) with no key; and every topic a service consumes (from
the services' subscriptions) gets an event naming tenant B about A's job/model/dataset (A's own
recorded events replayed under B's name, or built from A's ids), plus `job.requested` with a
missing, forged, revoked and other tenant's producer token. Each must be refused: a 4xx in OpenAI's
error shape, or a dead letter from that consumer with the reason; and A's objects must be unchanged.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from whetstone.cli.dev import build_services, upstreams_of
from whetstone.cli.keys import create_key, create_producer_token, operator_call
from whetstone.contracts import (
    TOPICS,
    BaseModelUpdatedV1,
    DatasetDeletedV1,
    DatasetSubmittedV1,
    Envelope,
    EvalRequestedV1,
    JobCancelledV1,
    JobFailedV1,
    JobPreemptedV1,
    JobPreemptRequestedV1,
    JobRequestedV1,
    MergeRequestedV1,
    ModelMergedV1,
    ModelPromotedV1,
    NodeFencedV1,
    NodeHeartbeatV1,
    job_id_for,
)
from whetstone.devstack.testing import outbox, producer_token, send, until
from whetstone.gateway.config import GatewaySettings
from whetstone.gateway.routing import owner_of
from whetstone.gateway.server import start_gateway
from whetstone.runtime.identity import (
    INTERNAL_HEADER,
    SCOPES,
    IdentityAuth,
    internal_secret,
    mint_producer_token,
)
from whetstone.runtime.messaging import encode, make_envelope

pytestmark = pytest.mark.integration

A, B = "demo", "acme"
FAST = {"n_epochs": 1, "batch_size": 8, "learning_rate_multiplier": 2, "max_seq_len": 128,
        "checkpoint_every_steps": 4, "lora_r": 4}
FORGED_SECRET = b"not-the-platform-secret"

# Routes that hold no tenant object at all: never attacked (said why).
NO_TENANT_OBJECT = {
    ("GET", "/healthz"): "liveness of the service process; no tenant data",
    ("GET", "/metrics"): "Prometheus scrape on the service port (not routed by the gateway); counts only",
}
# (a) only: routes whose request cannot name another tenant's object; B's answer must then hold none
# of A's ids (checked), but a 2xx is the right answer.
OWN_TENANT_ONLY = {
    ("GET", "/v1/fine_tuning/jobs"): "lists the caller's own jobs",
    ("GET", "/v1/files"): "lists the caller's own files",
    ("POST", "/v1/files"): "uploads into the caller's own prefix",
    ("GET", "/v1/models"): "lists the caller's own models (job_id/name filters inside its tenant: A's are tried)",
    ("GET", "/v1/keys"): "lists the caller's own keys (tenant_id is ignored for a tenant: A's is tried)",
    ("GET", "/v1/templates"): "lists the caller's own templates",
    ("POST", "/v1/templates"): "creates a template in the caller's own tenant",
    ("GET", "/v1/webhooks"): "lists the caller's own webhooks",
    ("GET", "/v1/serving/routes"): "lists the caller's own A/B routes",
    ("POST", "/v1/webhooks"): "creates a webhook for the caller's own tenant's events",
    ("GET", "/v1/usage"): "the caller's own month",
    ("GET", "/v1/base_models"): "the platform's base-model catalog: shared by design, no tenant object",
    ("GET", "/v1/base_models/{name}"): "one shared base model's versions: no tenant object",
    ("POST", "/v1/fine_tuning/alpha/graders/validate"): "a grader is the request itself: it names no stored object",
    ("POST", "/v1/fine_tuning/alpha/graders/run"): "grades the sample and item sent: no stored object",
}
# Topics with no tenant-scoped object to name (none today).
TOPIC_EXEMPT: dict[str, str] = {}
# Consumers whose refusal is an answer the tenant sees rather than a dead letter (checked in their outbox).
REFUSED_BY_ANSWER = {
    ("ingest", "dataset.submitted"): "ingest answers dataset.validated status=rejected, code source_outside_tenant: "
                                     "a verdict on the uploader's own dataset, which it can read",
}


def sft_file(first: int = 0) -> bytes:
    rows = [{"messages": [{"role": "user", "content": f"What is {i} + {i + 1}?"},
                          {"role": "assistant", "content": f"{i} + {i + 1} = {2 * i + 1}."}]} for i in range(first, first + 24)]
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def is_openai_error(r: httpx.Response) -> bool:
    try:
        err = r.json().get("error")
    except ValueError:
        return False
    return isinstance(err, dict) and isinstance(err.get("message"), str) and "type" in err


class Tally:
    def __init__(self) -> None:
        self.tried, self.refused, self.failures = 0, 0, []

    def check(self, ok: bool, what: str) -> None:
        self.tried += 1
        self.refused += ok
        if not ok:
            self.failures.append(what)


def public_routes(runtimes) -> list[tuple[str, str, str, bool]]:
    """(service, method, path template, takes a body) of every HTTP route every running service serves, from each
    service's own OpenAPI document (no route of the platform is hidden from it: checked below)."""
    out = []
    for rt in runtimes:
        rt.app.openapi_schema = None     # built fresh: every route the app holds now
        for path, ops in rt.app.openapi()["paths"].items():
            out += [(rt.name, m.upper(), path, "requestBody" in op) for m, op in sorted(ops.items())
                    if m in ("get", "post", "put", "patch", "delete")]
    return out


def test_no_route_hides_from_the_openapi_documents_the_attack_enumerates():
    roots = Path(__file__).resolve().parents[2] / "services"
    hidden = [str(f) for f in roots.glob("*/src/**/*.py") if "include_in_schema" in f.read_text()]
    assert not hidden, f"routes hidden from OpenAPI are not attacked by the cross-tenant test: {hidden}"


PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")


def template_of(path: str) -> str:
    return PARAM.sub(lambda m: "{" + m.group(1) + "}", path)


def fill(path: str, ids: dict[str, str]) -> str:
    prefix = "/".join(path.split("/")[:3])
    def value(m: re.Match) -> str:
        name = m.group(1)
        return str(ids.get(f"{prefix}:{name}") or ids[name])
    return PARAM.sub(value, path)


GRADER = {"type": "string_check", "name": "same", "input": "{{sample.output_text}}", "reference": "x",
          "operation": "eq"}


def attack_bodies(ids: dict[str, str]) -> dict[tuple[str, str], Any]:
    """What B sends, naming A's objects, to the routes that take a body."""
    return {
        ("POST", "/v1/fine_tuning/jobs"): {"template": ids["/v1/templates:name"], "training_file": ids["file_id"]},
        ("POST", "/v1/keys"): {"tenant_id": A, "scopes": ["admin"]},
        ("POST", "/v1/keys/producer_tokens"): {"tenant_id": A},
        ("POST", "/v1/chat/completions"): {"model": ids["model_name"], "messages": [{"role": "user", "content": "hi"}],
                                           "max_tokens": 2},
        ("POST", "/v1/completions"): {"model": ids["model_name"], "prompt": "hi", "max_tokens": 2},
        ("PUT", "/v1/serving/routes/{name}"): {"variants": [{"model": ids["model_id"], "weight": 1}]},
        ("POST", "/v1/models/{model_id}/promote"): {"stage": "archived", "reason": "attack"},
        ("POST", "/v1/base_models/{name}/versions"): {"sha256": "ab" * 32, "reason": "attack"},
        ("POST", "/v1/usage/jobs/{job_id}/review"): {"decision": "refund", "note": "attack"},
        ("POST", "/v1/templates"): {"name": "b-tmpl", "model": "tiny-llama"},
        ("POST", "/v1/models/{model_id}/rollback"): {"reason": "attack"},
        ("POST", "/v1/models/{model_id}/archive"): {"reason": "attack"},
        ("POST", "/v1/webhooks"): {"url": "http://127.0.0.1:9/b"},
        ("POST", "/v1/files"): None,
        ("POST", "/internal/keys/verify"): {"key": ids["a_key"]},
        ("POST", "/v1/fine_tuning/alpha/graders/validate"): {"grader": GRADER},
        ("POST", "/v1/fine_tuning/alpha/graders/run"): {"grader": GRADER, "model_sample": "x", "item": {}},
    }


async def snapshot(c: httpx.AsyncClient, key: str, ids: dict[str, str]) -> dict[str, Any]:
    """Everything A can see of its own objects (timestamps of key use aside)."""
    h = {"Authorization": f"Bearer {key}"}
    paths = [f"/v1/fine_tuning/jobs/{ids['job_id']}", f"/v1/fine_tuning/jobs/{ids['job_id']}/events?limit=100",
             f"/v1/fine_tuning/jobs/{ids['job_id']}/checkpoints", "/v1/fine_tuning/jobs", f"/v1/files/{ids['file_id']}",
             "/v1/files", f"/v1/models/{ids['model_id']}", f"/v1/models?job_id={ids['job_id']}",
             f"/v1/templates/{ids['/v1/templates:name']}", f"/v1/webhooks/{ids['webhook_id']}",
             f"/v1/serving/routes/{ids['/v1/serving:name']}", f"/v1/usage/jobs/{ids['job_id']}", "/v1/keys"]
    out = {}
    for p in paths:
        r = await c.get(p, headers=h)
        body = r.json()
        for k in body.get("data", []) if isinstance(body.get("data"), list) else []:
            if isinstance(k, dict):
                k.pop("last_used_at", None)
        out[p] = (r.status_code, body)
    return out


async def test_no_tenant_can_act_as_another(platform, settings, monkeypatch):
    from whetstone.modelkit.tiny import build_tiny_model

    # webhooks reach public addresses only: the operator allow-lists the loopback port A's hook names
    monkeypatch.setenv("WHETSTONE_SCHEDULER_WEBHOOK_ALLOW_HOSTS", '["127.0.0.1:9"]')

    await asyncio.to_thread(build_tiny_model, Path(settings.model_catalog) / "tiny-llama")
    builders = [lambda s=s: s for s in build_services(*_builders())]
    async with platform(*builders) as p:
        runtimes = list(p.runtimes.values())
        assert "serving" in p.runtimes, "serving did not start: its routes would go unattacked"
        upstreams = upstreams_of(runtimes)
        gw = await start_gateway(GatewaySettings(), upstreams, port=0)
        try:
            async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
                await attack(c, p, upstreams, runtimes, settings)
        finally:
            await gw.stop()


def _builders():
    from whetstone.cli.dev import core_service_builders, optional_service_builders
    return core_service_builders(), optional_service_builders()


async def attack(c: httpx.AsyncClient, p, upstreams: dict[str, str], runtimes, settings) -> None:
    sched = upstreams["scheduler"]
    key = lambda t, **kw: asyncio.to_thread(create_key, t, base_url=sched, **kw)
    a_key = await key(A, scopes=list(SCOPES))
    b_key = (await key(B, scopes=list(SCOPES)))["key"]
    b_revoked = await key(B, scopes=list(SCOPES))
    ha = {"Authorization": f"Bearer {a_key['key']}"}

    # -- tenant A's objects
    f = (await c.post("/v1/files", headers=ha, files={"file": ("a.jsonl", sft_file())},
                      data={"purpose": "fine-tune"})).json()
    await until(lambda: c.get(f"/v1/files/{f['id']}", headers=ha), lambda r: r.json()["status"] != "uploaded",
                120, "A's file")
    r = await c.post("/v1/templates", headers=ha, json={"name": "a-tmpl", "model": "tiny-llama",
                                                        "hyperparameters": FAST})
    assert r.status_code == 200, r.text
    job = (await c.post("/v1/fine_tuning/jobs", headers=ha | {"Idempotency-Key": "a-1"},
                        json={"template": "a-tmpl", "training_file": f["id"]})).json()
    assert "id" in job, job
    done = await until(lambda: c.get(f"/v1/fine_tuning/jobs/{job['id']}", headers=ha),
                       lambda r: r.json()["status"] in ("succeeded", "failed", "cancelled")
                       and (r.json()["status"] != "succeeded" or r.json().get("fine_tuned_model")), 420, "A's job")
    assert done.json()["status"] == "succeeded", done.json()
    model = (await until(lambda: c.get(f"/v1/models?job_id={job['id']}", headers=ha),
                         lambda r: r.json()["data"], 60, "A's model")).json()["data"][0]
    hook = (await c.post("/v1/webhooks", headers=ha, json={"url": "http://127.0.0.1:9/a",
                                                            "events": ["job.cancelled"]})).json()
    route = await c.put("/v1/serving/routes/a-route", headers=ha,
                        json={"variants": [{"model": model["id"], "weight": 1}]})
    assert route.status_code == 200, route.text
    usage = await until(lambda: c.get(f"/v1/usage/jobs/{job['id']}", headers=ha),
                        lambda r: r.status_code == 200 and r.json()["status"] == "closed", 60, "A's usage")
    ids = {"file_id": f["id"], "job_id": job["id"], "fine_tuning_job_id": job["id"], "model_id": model["model_id"],
           "model_name": done.json()["fine_tuned_model"], "webhook_id": hook["id"], "key_id": a_key["id"], "a_key": a_key["key"],
           "tenant_id": A, "version": "1", "line_id": str(usage.json()["entries"][0]["id"]),
           "/v1/templates:name": "a-tmpl", "/v1/serving:name": "a-route", "/v1/base_models:name": "tiny-llama",
           "/v1/models:name": "adapter_model.safetensors", "/v1/operator:topic": "job.requested"}
    revoked = await asyncio.to_thread(create_producer_token, A, base_url=sched)   # A's, revoked at once
    await asyncio.to_thread(operator_call, "POST", f"/v1/keys/{revoked['id']}/revoke", base_url=sched)
    ids["revoked_token"] = revoked["token"]
    # A's tokens for the bus half, issued before A's objects are read (a token is listed with A's keys)
    ids["valid_token"] = await producer_token(p["scheduler"], A)
    ids["expired_token"] = await producer_token(p["scheduler"], A, expires_in_s=-1)
    await asyncio.sleep(2)   # let A's own last events settle before the reference snapshot
    before = await snapshot(c, a_key["key"], ids)

    # -- HTTP: every route of every service
    await asyncio.to_thread(operator_call, "POST", f"/v1/keys/{b_revoked['id']}/revoke", base_url=sched)
    await asyncio.sleep(GatewaySettings().key_cache_ttl_s + 0.2)   # the gateway's verdict cache
    routes = public_routes(runtimes)
    bodies = attack_bodies(ids)
    a_ids = {ids[k] for k in ("file_id", "job_id", "model_id", "webhook_id", "key_id")}
    tally, exempt = Tally(), []
    for service, method, raw_path, has_body in routes:
        path = template_of(raw_path)
        if (method, path) in NO_TENANT_OBJECT:
            exempt.append((method, path, NO_TENANT_OBJECT[(method, path)]))
            continue
        url = fill(raw_path, ids)
        internal = path.startswith("/internal/")
        assert internal or owner_of(url) == service, f"{method} {path} of {service} is neither public nor internal"
        body = bodies.get((method, path), ...)
        if body is ... and has_body:
            tally.check(False, f"new route {method} {path}: add the body B sends naming A's objects to attack_bodies()")
            continue
        kw: dict[str, Any] = {"json": body} if body not in (..., None) else {}
        if (method, path) == ("POST", "/v1/files"):
            kw = {"files": {"file": ("b.jsonl", sft_file(100))}, "data": {"purpose": "fine-tune"}}
        # (b) a forged identity (and a forged internal header) on the service's own port
        forged = {INTERNAL_HEADER: f"{int(time.time())}:00", "X-Tenant-Id": A}
        r = await c.request(method, upstreams[service] + url, headers=forged,
                            auth=IdentityAuth(A, SCOPES, secret=FORGED_SECRET), **kw)
        tally.check(r.status_code == 401 and is_openai_error(r), f"(b) forged identity {method} {url}: {r.status_code}")
        if internal:
            continue  # the gateway never routes /internal/*
        # (c) a revoked key, (d) no key, through the gateway
        for label, h in (("(c) revoked key", {"Authorization": f"Bearer {b_revoked['key']}"}), ("(d) no key", {})):
            r = await c.request(method, url, headers=h, **kw)
            tally.check(r.status_code == 401 and is_openai_error(r), f"{label} {method} {url}: {r.status_code}")
        # (a) B's valid all-scopes key on A's ids
        query = {"job_id": ids["job_id"], "tenant_id": A} if method == "GET" and "{" not in path else None
        r = await c.request(method, url, headers={"Authorization": f"Bearer {b_key}"}, params=query, **kw)
        if (method, path) in OWN_TENANT_ONLY:
            leaked = [i for i in a_ids if i in r.text]
            tally.check(not leaked and r.status_code < 500, f"(a) {method} {url} leaked {leaked}: {r.status_code}")
            exempt.append((method, path, "(a) " + OWN_TENANT_ONLY[(method, path)]))
        else:   # only a refusal counts: a 400 is a probe the route could not even read, not a refusal
            tally.check(r.status_code in (403, 404) and is_openai_error(r),
                        f"(a) B's key {method} {url}: {r.status_code} {r.text[:200]}")
    http_tried, http_refused = tally.tried, tally.refused
    print(f"\nHTTP: routes={len(routes)} tried={http_tried} refused={http_refused}")
    for method, path, why in exempt:
        print(f"  exempt {method} {path}: {why}")

    # -- Kafka: every consumed topic, an event naming B about A's objects
    sent = await forge_events(p, runtimes, settings, ids, model)
    dlq = await dead_letters(settings.kafka_bootstrap, {t for _, t, _, _ in sent},
                             {(e, s) for s, t, e, _ in sent if (s, t) not in REFUSED_BY_ANSWER})
    reasons: dict[str, int] = {}
    for service, topic, event_id, expected in sent:
        if (service, topic) in REFUSED_BY_ANSWER:
            answers = [e for e in await outbox(p[service], "dataset.validated") if e["tenant_id"] == B
                       and e["payload"]["dataset_id"] == ids["file_id"] and e["payload"]["status"] == "rejected"
                       and "source_outside_tenant" in json.dumps(e["payload"])]
            tally.check(bool(answers), f"{topic} -> {service}: no rejection answered")
            reasons["answered:source_outside_tenant"] = reasons.get("answered:source_outside_tenant", 0) + 1
            continue
        letter = dlq.get((event_id, service))
        reason = re.match(r"rejected \(([\w-]+)\)", letter["error"]) if letter else None
        # the refusal must be for the reason the attack deserves (tenant_mismatch for another tenant's
        # object), not any dead letter (a parse error would dead-letter too, refusing nothing)
        tally.check(reason is not None and reason.group(1) == expected,
                    f"{topic} -> {service}: expected {expected}, got "
                    f"{'no dead letter' if not letter else letter['error'][:200]}")
        if reason:
            reasons[reason.group(1)] = reasons.get(reason.group(1), 0) + 1
    preclaimed = [e for s, t, e, x in sent if t == "job.requested" and x == "tenant_mismatch"]
    assert preclaimed, "the pre-claim case was not sent"
    claimed = await p["scheduler"].pool.fetchval(
        "SELECT count(*) FROM jobs WHERE job_id = $1", job_id_for(A, "a-next"))
    tally.check(claimed == 0, f"B pre-claimed A's next job id {job_id_for(A, 'a-next')}")
    print(f"Kafka: deliveries={len(sent)} tried={tally.tried - http_tried} refused={tally.refused - http_refused}")
    print(f"  refusals by reason: {dict(sorted(reasons.items()))}")
    for topic, why in TOPIC_EXEMPT.items():
        print(f"  exempt topic {topic}: {why}")
    for (service, topic), why in REFUSED_BY_ANSWER.items():
        print(f"  {topic} -> {service} refused by answer: {why}")
    after = await snapshot(c, a_key["key"], ids)
    changed = [k for k in before if before[k] != after[k]]
    print(f"tried={tally.tried} refused={tally.refused} ({100 * tally.refused / tally.tried:.1f} %); "
          f"A's objects changed: {changed}")
    assert not tally.failures, "not refused:\n" + "\n".join(tally.failures)
    assert not changed, {k: (before[k], after[k]) for k in changed}


async def forge_events(p, runtimes, settings, ids, model) -> list[tuple[str, str, str, str]]:
    """Send, for each (service, topic) a service consumes, one event naming tenant B about A's
    objects; returns (service, topic, event_id, the dead letter's reason expected) of each delivery."""
    boot = settings.kafka_bootstrap
    consumers: dict[str, list[str]] = {}
    for rt in runtimes:
        for topic in rt.service.subscriptions:
            consumers.setdefault(topic, []).append(rt.name)
    sent: list[tuple[str, str, str]] = []
    job_id, now = ids["job_id"], datetime.now(UTC)
    node = await p["scheduler"].pool.fetchval("SELECT node_id FROM nodes ORDER BY node_id LIMIT 1") or "cpu-0"
    built = {   # topics A's run did not use: built from A's ids
        "job.cancelled": JobCancelledV1(job_id=job_id),
        "job.preempt_requested": JobPreemptRequestedV1(job_id=job_id, node_id=node or "cpu-0", reason="drain"),
        "node.fenced": NodeFencedV1(job_id=job_id, node_id=node or "cpu-0", attempt=1, reason="attack"),
        "job.preempted": JobPreemptedV1(job_id=job_id, segment_id=f"{job_id}-s1", node_id=node or "cpu-0",
                                        reason="spot_loss", stopped_at=now),
        "job.failed": JobFailedV1(job_id=job_id, error_class="platform", code="attack", message="attack"),
        "model.promoted": ModelPromotedV1(model_id=ids["model_id"], from_stage="dev", to_stage="production",
                                          reason="attack"),
        "base_model.updated": BaseModelUpdatedV1(name="tiny-llama", sha256="cd" * 32),
        "eval.requested": EvalRequestedV1(request_id=uuid.uuid4().hex, job_id=job_id, model_id=ids["model_id"],
                                          checkpoint_uri=model.get("artifact_uri") or f"s3://whetstone/tenants/{A}/x",
                                          manifest_sha256="ab" * 32, base_model="tiny-llama",
                                          base_model_sha256="ab" * 32),
        "model.merge_requested": MergeRequestedV1(
            merge_id=uuid.uuid4().hex, model_id=ids["model_id"], job_id=job_id,
            artifact_uri=model.get("artifact_uri") or f"s3://whetstone/tenants/{A}/x", manifest_sha256="ab" * 32,
            base_model="tiny-llama", base_model_sha256="ab" * 32),
        "model.merged": ModelMergedV1(merge_id=uuid.uuid4().hex, model_id=ids["model_id"], status="succeeded"),
        "dataset.deleted": DatasetDeletedV1(dataset_id=ids["file_id"]),
        "dataset.submitted": DatasetSubmittedV1(dataset_id=ids["file_id"], name="a.jsonl",
                                                source_uri=f"s3://whetstone/tenants/{A}/datasets/{ids['file_id']}"),
        "node.heartbeat": NodeHeartbeatV1(node_id=node or "cpu-0", gpu_type="cpu", gpu_count=1, sent_at=now,
                                          running_jobs=[job_id]),
    }
    recorded = await recorded_of_a(boot, sorted(consumers))
    for topic, services in sorted(consumers.items()):
        if topic in TOPIC_EXEMPT:
            continue
        if topic == "job.requested":
            continue   # below: every way a producer token can be wrong
        env = recorded.get(topic) or (make_envelope(built[topic], producer="attacker", tenant_id=A)
                                      if topic in built else None)
        assert env is not None, f"consumed topic {topic}: no event of A's to replay and none built: add one"
        forged = env.model_copy(update={"event_id": uuid.uuid4(), "tenant_id": B, "occurred_at": now})
        await send(boot, TOPICS[topic].name, encode(forged), forged.key)
        sent += [(s, topic, str(forged.event_id), "tenant_mismatch") for s in services]
    # job.requested: A's job by a producer without a valid token for A
    valid = ids["valid_token"]
    tampered = valid[:-1] + ("0" if valid[-1] != "0" else "1")   # one MAC digit changed, never left as it was
    for token, reason in ((None, "producer_token_missing"), (mint_producer_token(A, FORGED_SECRET), "producer_token_forged"),
                          (ids["revoked_token"], "producer_token_revoked"),
                          (await producer_token(p["scheduler"], B), "producer_token_tenant_mismatch"),
                          (tampered, "producer_token_forged"),
                          ("whp_" + "0" * 16 + f".{A}.9999999999." + "0" * 32, "producer_token_forged"),
                          (mint_producer_token(A, internal_secret(settings.data_dir)), "producer_token_unknown"),
                          (ids["expired_token"], "producer_token_expired")):
        req = JobRequestedV1(job_id=job_id_for(A, f"attack-{uuid.uuid4().hex[:6]}"), idempotency_key="attack",
                             model="tiny-llama", training_file=ids["file_id"])
        env = make_envelope(req, producer="attacker", tenant_id=A).model_copy(update={"producer_token": token})
        await send(boot, "job.requested", encode(env), env.key)
        sent += [(s, "job.requested", str(env.event_id), reason) for s in consumers["job.requested"]]
    # the pre-claim: B's own valid token, B's envelope, the job id A's next request with key "a-next" will have
    req = JobRequestedV1(job_id=job_id_for(A, "a-next"), idempotency_key="a-next", model="tiny-llama",
                         training_file=ids["file_id"])
    env = make_envelope(req, producer="attacker", tenant_id=B).model_copy(
        update={"producer_token": await producer_token(p["scheduler"], B)})
    await send(boot, "job.requested", encode(env), env.key)
    sent += [(s, "job.requested", str(env.event_id), "tenant_mismatch") for s in consumers["job.requested"]]
    return sent


async def recorded_of_a(boot: str, topics: list[str]) -> dict[str, Envelope]:
    """The last event of tenant A on each topic, as the platform's services published it."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=boot, group_id=f"test-{uuid.uuid4().hex[:8]}",
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    out: dict[str, Envelope] = {}
    try:
        quiet_until = time.monotonic() + 3
        while time.monotonic() < quiet_until:
            for tp, records in (await consumer.getmany(timeout_ms=300)).items():
                quiet_until = time.monotonic() + 1.5
                for rec in records:
                    try:
                        env = Envelope.model_validate_json(rec.value)
                    except ValueError:
                        continue
                    if env.tenant_id == A:
                        out[tp.topic] = env
    finally:
        await consumer.stop()
    return out


async def dead_letters(boot: str, topics: set[str], expected: set[tuple[str, str]], timeout: float = 90) -> dict:
    """(original event_id, consumer service) -> dead letter payload, waiting until every one expected is in."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(*sorted(TOPICS[t].dlq for t in topics), bootstrap_servers=boot,
                                group_id=f"test-{uuid.uuid4().hex[:8]}", auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    deadline, found = time.monotonic() + timeout, {}
    try:
        while not expected <= found.keys() and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for rec in records:
                    letter = Envelope.model_validate_json(rec.value).payload
                    m = re.search(r'"event_id":\s*"([0-9a-f-]{36})"', letter.get("value", ""))
                    if m:
                        found[(m.group(1), letter["consumer"])] = letter
    finally:
        await consumer.stop()
    return found
