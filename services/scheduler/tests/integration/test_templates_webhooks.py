"""Job templates (versioned, per tenant, a job names one and overrides fields) and tenant webhooks
(signed, retried with backoff, a delivery log), on the real embedded stack with a real local
HTTP receiver that checks every signature."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from aiohttp import web
from whetstone.contracts import (
    DatasetValidatedV1,
    Lineage,
    ModelPromotedV1,
    ModelRegisteredV1,
)
from whetstone.devstack.testing import outbox, send_event, wait_until
from whetstone.runtime.identity import identity_headers
from whetstone.scheduler.bootstrap import build_service
from whetstone.scheduler.config import SchedulerSettings
from whetstone.scheduler.domain.webhooks import verify

pytestmark = pytest.mark.integration


def tenant(name: str) -> dict[str, str]:
    return identity_headers(name, ("read", "write"))   # signed with the test platform's secret: built per test

TEMPLATE_V1 = """
name: sft-base
description: LoRA SFT on the tiny Llama
model: {model}
method:
  type: supervised
  supervised:
    hyperparameters: {{n_epochs: 3, learning_rate: 0.0002}}
suffix: house
eval_config: {{stages: [holdout]}}
"""


async def test_templates_versions_overrides_pins_and_isolation(platform, settings, tiny_model):
    async with platform(lambda: build_service(SchedulerSettings(node_timeout_s=300))) as p:
        rt, DEMO, ACME = p["scheduler"], tenant("demo"), tenant("acme")
        await send_event(settings.kafka_bootstrap, DatasetValidatedV1(
            dataset_id="file-t", version="cd" * 32, name="d.jsonl", status="accepted", purpose="sft", rows_total=20,
            rows_kept=20, tokens_total=4000, train_uri="s3://whetstone/tenants/demo/datasets/file-t/train.jsonl"),
            "demo")
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 1 FROM datasets"), 30, "dataset")
        async with httpx.AsyncClient(base_url=p.url("scheduler")) as http:
            yaml_headers = {**DEMO, "Content-Type": "application/yaml"}
            v1 = await http.post("/v1/templates", content=TEMPLATE_V1.format(model=tiny_model), headers=yaml_headers)
            assert v1.status_code == 200, v1.text
            assert v1.json()["version"] == 1 and v1.json()["template"]["suffix"] == "house"
            v2 = await http.post("/v1/templates", headers=DEMO, json={
                "name": "sft-base", "model": tiny_model, "method": {"type": "supervised"},
                "hyperparameters": {"n_epochs": 2}, "suffix": "house2"})
            assert v2.status_code == 200 and v2.json()["version"] == 2
            latest = (await http.get("/v1/templates/sft-base", headers=DEMO)).json()
            assert latest["version"] == 2 and latest["template"]["suffix"] == "house2"
            pinned = (await http.get("/v1/templates/sft-base/versions/1", headers=DEMO)).json()
            assert pinned["template"]["method"]["supervised"]["hyperparameters"]["n_epochs"] == 3   # immutable
            listed = (await http.get("/v1/templates", headers=DEMO)).json()
            assert [t["id"] for t in listed["data"]] == ["sft-base@2"]

            # a job from the latest version, overriding one hyperparameter and the suffix
            job = await http.post("/v1/fine_tuning/jobs", headers=DEMO, json={
                "template": "sft-base", "training_file": "file-t", "hyperparameters": {"n_epochs": 1},
                "suffix": "mine"})
            assert job.status_code == 200, job.text
            view = job.json()
            assert view["template"] == {"name": "sft-base", "version": 2,
                                        "overrides": ["hyperparameters.n_epochs", "suffix"]}
            assert view["model"] == tiny_model and view["hyperparameters"]["n_epochs"] == 1
            assert view["user_provided_suffix"] == "mine"
            # pinned with @1: that version's method hyperparameters and eval config, overrides merged in
            old = (await http.post("/v1/fine_tuning/jobs", headers=DEMO, json={
                "template": "sft-base@1", "training_file": "file-t",
                "hyperparameters": {"learning_rate": 0.0001}})).json()
            assert old["template"] == {"name": "sft-base", "version": 1, "overrides": ["hyperparameters.learning_rate"]}
            resolved = old["resolved_hyperparameters"]
            assert resolved["n_epochs"] == 3 and resolved["learning_rate"] == 0.0001
            assert old["eval_config"] == {"stages": ["holdout"]} and view["eval_config"] is None
            assert old["user_provided_suffix"] == "house"

            # job.queued carries the template for the registry's lineage
            async def queued() -> list[dict]:
                rows = [e["payload"] for e in await outbox(rt, "job.queued")]
                return rows if len(rows) == 2 else None
            events = {e["job_id"]: e for e in await wait_until(queued, 30, "job.queued x2")}
            assert events[view["id"]]["job_template"] == "sft-base"
            assert events[view["id"]]["job_template_version"] == "2"
            assert events[old["id"]]["job_template_version"] == "1"
            assert events[old["id"]]["spec"]["eval_config"] == {"stages": ["holdout"]}

            # another tenant: its own namespace, never ours
            for path in ("/v1/templates/sft-base", "/v1/templates/sft-base/versions/1"):
                assert (await http.get(path, headers=ACME)).status_code == 404
            assert (await http.get("/v1/templates", headers=ACME)).json()["data"] == []
            theirs = await http.post("/v1/fine_tuning/jobs", headers=ACME,
                                     json={"template": "sft-base", "training_file": "file-t"})
            assert theirs.status_code == 404 and theirs.json()["error"]["param"] == "template"
            missing = await http.post("/v1/fine_tuning/jobs", headers=DEMO,
                                      json={"template": "sft-base@9", "training_file": "file-t"})
            assert missing.status_code == 404

            # bad templates: 400 naming the field, and no version written
            bad_cases = [
                ({"name": "x", "model": tiny_model, "hyperparameters": {"n_epochs": -1}}, "hyperparameters.n_epochs"),
                ({"name": "x", "model": tiny_model, "method": {"type": "rlhf"}}, "method"),
                ({"name": "x", "model": tiny_model, "colour": "red"}, "colour"),
                ({"name": "x", "model": tiny_model, "training_file": "file-t"}, "training_file"),
                ({"name": "no spaces", "model": tiny_model}, "name"),
                ({"name": "x"}, "model"),
                ({"name": "x", "model": "no-such-model"}, "model"),
                ({"name": "x", "model": tiny_model, "resources": {"gpu_type": "h100", "gpus_per_node": 0}}, "resources"),
            ]
            for body, param in bad_cases:
                r = await http.post("/v1/templates", headers=DEMO, json=body)
                assert r.status_code == 400, (body, r.text)
                assert r.json()["error"]["param"].startswith(param), (body, r.json())
            broken = await http.post("/v1/templates", headers=yaml_headers, content="name: x\nmodel: [unclosed\n")
            assert broken.status_code == 400 and broken.json()["error"]["param"] == "body"
            assert "line" in broken.json()["error"]["message"]
            assert (await http.get("/v1/templates/x", headers=DEMO)).status_code == 404
            # a job naming a template still gets the job rules: a bad override is a 400 naming it
            r = await http.post("/v1/fine_tuning/jobs", headers=DEMO, json={
                "template": "sft-base", "training_file": "file-t", "hyperparameters": {"n_epochs": 0}})
            assert r.status_code == 400 and "n_epochs" in r.json()["error"]["param"]
            r = await http.post("/v1/fine_tuning/jobs", headers=DEMO, json={"training_file": "file-t"})
            assert r.status_code == 400 and r.json()["error"]["param"] == "model"


class Receiver:
    """A webhook receiver: checks each signature, fails the first `failures` calls of each event with a 500."""

    def __init__(self, failures: int = 0, status: int = 200) -> None:
        self.failures, self.status = failures, status
        self.secret = ""
        self.calls: list[dict] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.calls.append({"body": json.loads(body), "event_id": request.headers.get("Whetstone-Event-Id"),
                           "signed": verify(self.secret, request.headers.get("Whetstone-Signature", ""), body),
                           "t": int(request.headers.get("Whetstone-Signature", "t=0,").split(",")[0][2:])})
        if sum(c["event_id"] == self.calls[-1]["event_id"] for c in self.calls) <= self.failures:
            return web.Response(status=500, text="not yet")
        if self.status in (301, 302, 307):
            return web.Response(status=self.status, headers={"Location": "http://127.0.0.1:9/elsewhere"})
        return web.Response(status=self.status, text="ok")


async def serve(*receivers: Receiver) -> web.AppRunner:
    app = web.Application()
    for i, r in enumerate(receivers):
        app.router.add_post(f"/hook{i}", r.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    for i, r in enumerate(receivers):
        r.url = f"http://127.0.0.1:{port}/hook{i}"
    return runner


async def test_webhooks_signed_retried_logged_and_filtered(platform, settings, tiny_model):
    flaky, quiet, redirect = Receiver(failures=2), Receiver(), Receiver(status=302)
    runner = await serve(flaky, quiet, redirect)
    cfg = SchedulerSettings(node_timeout_s=300, webhook_backoff_s=0.3, webhook_poll_s=0.1, webhook_max_attempts=3,
                            webhook_timeout_s=2)
    try:
        async with platform(lambda: build_service(cfg)) as p, httpx.AsyncClient(base_url=p.url("scheduler")) as http:
            rt, DEMO, ACME = p["scheduler"], tenant("demo"), tenant("acme")
            hooks = {}
            for name, receiver, events in (("flaky", flaky, ["job.cancelled", "model.registered", "model.promoted"]),
                                           ("quiet", quiet, ["job.succeeded"]),
                                           ("redirect", redirect, ["job.cancelled"])):
                r = await http.post("/v1/webhooks", headers=DEMO, json={"url": receiver.url, "events": events})
                assert r.status_code == 200, r.text
                receiver.secret = r.json()["secret"]
                hooks[name] = r.json()["id"]
            listed = (await http.get("/v1/webhooks", headers=DEMO)).json()["data"]
            assert {h["id"] for h in listed} == set(hooks.values()) and all("secret" not in h for h in listed)
            for body, param in (({"url": "ftp://example.com/x"}, "url"), ({"url": "file:///etc/passwd"}, "url"),
                                ({"url": flaky.url, "events": ["job.exploded"]}, "events.0")):
                r = await http.post("/v1/webhooks", headers=DEMO, json=body)
                assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text

            job = (await http.post("/v1/fine_tuning/jobs", headers=DEMO,
                                   json={"model": tiny_model, "training_file": "file-never"})).json()
            cancelled = await http.post(f"/v1/fine_tuning/jobs/{job['id']}/cancel", headers=DEMO)
            assert cancelled.status_code == 200, cancelled.text
            await send_event(settings.kafka_bootstrap, ModelRegisteredV1(
                model_id="mdl-9", name="tiny-llama-9", stage="staging", artifact_uri="s3://b/a", artifact_sha256="1" * 64,
                lineage=Lineage(job_id=job["id"], base_model=tiny_model, base_model_sha256="2" * 64,
                                dataset_id="file-never", dataset_version="cd" * 32, method="lora",
                                hyperparameters_hash="3" * 64)), "demo", times=2)   # a redelivery: sent once
            await send_event(settings.kafka_bootstrap, ModelPromotedV1(
                model_id="mdl-8", from_stage="staging", to_stage="production", reason="ok"), "acme")

            async def log(name: str, expect: int) -> list[dict] | None:
                r = await http.get(f"/v1/webhooks/{hooks[name]}/deliveries", headers=DEMO)
                data = r.json()["data"]
                return data if len(data) == expect and all(d["status"] != "pending" for d in data) else None

            deliveries = {d["event_type"]: d for d in await wait_until(lambda: log("flaky", 2), 30, "flaky log")}
            for d in deliveries.values():   # failed twice, then delivered: the log shows the three attempts
                assert d["status"] == "succeeded" and d["attempts"] == 3 and d["last_status_code"] == 200, d
            assert len(flaky.calls) == 6
            assert all(c["signed"] for c in flaky.calls) and abs(flaky.calls[-1]["t"] - time.time()) < 60
            by_type = {c["body"]["type"]: c for c in flaky.calls}
            assert by_type["job.cancelled"]["body"]["data"]["id"] == job["id"]
            assert by_type["job.cancelled"]["body"]["data"]["status"] == "cancelled"
            assert by_type["model.registered"]["body"]["data"]["model_id"] == "mdl-9"
            # the retried delivery kept its event id (receivers dedupe on it); acme's promotion is not ours
            assert len({c["event_id"] for c in flaky.calls}) == 2 and "model.promoted" not in by_type
            assert len({c["t"] for c in flaky.calls}) > 1   # each attempt signed afresh (and apart in time)
            # a redirect is never followed: a failure, retried, then given up
            red = (await wait_until(lambda: log("redirect", 1), 30, "redirect log"))[0]
            assert red["status"] == "failed" and red["attempts"] == 3 and red["last_status_code"] == 302
            assert "not followed" in red["last_error"] and len(redirect.calls) == 3
            assert quiet.calls == [] and (await log("quiet", 0)) == []   # filtered: only job.succeeded

            # another tenant sees none of it; a deleted hook gets nothing more
            assert (await http.get(f"/v1/webhooks/{hooks['flaky']}/deliveries", headers=ACME)).status_code == 404
            assert (await http.delete(f"/v1/webhooks/{hooks['flaky']}", headers=ACME)).status_code == 404
            assert (await http.delete(f"/v1/webhooks/{hooks['flaky']}", headers=DEMO)).status_code == 200
            assert (await http.get(f"/v1/webhooks/{hooks['flaky']}", headers=DEMO)).status_code == 404
            assert await rt.pool.fetchval("SELECT count(*) FROM webhook_deliveries") == 3
    finally:
        await runner.cleanup()
