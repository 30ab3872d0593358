"""Job templates (versioned, per tenant, a job names one and overrides fields) and tenant webhooks
(signed, retried with backoff, a delivery log), on the real embedded stack with a real local
HTTP receiver that checks every signature."""

from __future__ import annotations

import asyncio
import contextlib
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
from whetstone.runtime.identity import IdentityAuth
from whetstone.scheduler.bootstrap import build_service
from whetstone.scheduler.config import SchedulerSettings
from whetstone.scheduler.domain.webhooks import verify

pytestmark = pytest.mark.integration


def tenant(name: str) -> IdentityAuth:
    return IdentityAuth(name, ("read", "write"))   # each request signed with the test platform's secret

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
    # the operator configured MLflow (nothing here logs to it): a template may ask for mlflow tracking
    settings_ = SchedulerSettings(node_timeout_s=300, WHETSTONE_MLFLOW_TRACKING_URI="http://127.0.0.1:9")
    async with platform(lambda: build_service(settings_)) as p:
        rt, DEMO, ACME = p["scheduler"], tenant("demo"), tenant("acme")
        await send_event(settings.kafka_bootstrap, DatasetValidatedV1(
            dataset_id="file-t", version="cd" * 32, name="d.jsonl", status="accepted", purpose="sft", rows_total=20,
            rows_kept=20, tokens_total=4000, train_uri="s3://whetstone/tenants/demo/datasets/file-t/train.jsonl"),
            "demo")
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 1 FROM datasets"), 30, "dataset")
        async with httpx.AsyncClient(base_url=p.url("scheduler")) as http:
            yaml_headers = {"Content-Type": "application/yaml"}
            v1 = await http.post("/v1/templates", content=TEMPLATE_V1.format(model=tiny_model), auth=DEMO, headers=yaml_headers)
            assert v1.status_code == 200, v1.text
            assert v1.json()["version"] == 1 and v1.json()["template"]["suffix"] == "house"
            v2 = await http.post("/v1/templates", auth=DEMO, json={
                "name": "sft-base", "model": tiny_model, "method": {"type": "supervised"},
                "hyperparameters": {"n_epochs": 2}, "suffix": "house2"})
            assert v2.status_code == 200 and v2.json()["version"] == 2
            latest = (await http.get("/v1/templates/sft-base", auth=DEMO)).json()
            assert latest["version"] == 2 and latest["template"]["suffix"] == "house2"
            pinned = (await http.get("/v1/templates/sft-base/versions/1", auth=DEMO)).json()
            assert pinned["template"]["method"]["supervised"]["hyperparameters"]["n_epochs"] == 3   # immutable
            listed = (await http.get("/v1/templates", auth=DEMO)).json()
            assert [t["id"] for t in listed["data"]] == ["sft-base@2"]

            # a job from the latest version, overriding one hyperparameter and the suffix
            job = await http.post("/v1/fine_tuning/jobs", auth=DEMO, json={
                "template": "sft-base", "training_file": "file-t", "hyperparameters": {"n_epochs": 1},
                "suffix": "mine"})
            assert job.status_code == 200, job.text
            view = job.json()
            assert view["template"] == {"name": "sft-base", "version": 2,
                                        "overrides": ["hyperparameters.n_epochs", "suffix"]}
            assert view["model"] == tiny_model and view["hyperparameters"]["n_epochs"] == 1
            assert view["user_provided_suffix"] == "mine"
            # pinned with @1: that version's method hyperparameters and eval config, overrides merged in
            old = (await http.post("/v1/fine_tuning/jobs", auth=DEMO, json={
                "template": "sft-base@1", "training_file": "file-t",
                "hyperparameters": {"learning_rate": 0.0001}})).json()
            assert old["template"] == {"name": "sft-base", "version": 1, "overrides": ["hyperparameters.learning_rate"]}
            resolved = old["resolved_hyperparameters"]
            assert resolved["n_epochs"] == 3 and resolved["learning_rate"] == 0.0001
            assert old["eval_config"] == {"stages": ["holdout"]} and view["eval_config"] is None
            assert old["user_provided_suffix"] == "house"

            # a template pins the trainer image by digest: the job shows it and its spec carries it to the
            # agent (which trains it only where that digest runs); a tag is refused naming the field
            pin = "ghcr.io/whetstone/trainer@sha256:" + "7" * 64
            img = await http.post("/v1/templates", auth=DEMO, json={"name": "sft-img", "model": tiny_model,
                                                                    "image": pin})
            assert img.status_code == 200 and img.json()["template"]["image"] == pin, img.text
            imaged = (await http.post("/v1/fine_tuning/jobs", auth=DEMO, json={
                "template": "sft-img", "training_file": "file-t"})).json()
            assert imaged["image"] == pin and view["image"] is None, imaged
            for where, body in (("/v1/templates", {"name": "sft-tag", "model": tiny_model,
                                                   "image": "ghcr.io/whetstone/trainer:latest"}),
                                ("/v1/fine_tuning/jobs", {"template": "sft-img", "training_file": "file-t",
                                                          "image": "ghcr.io/whetstone/trainer:v3"})):
                tagged = await http.post(where, auth=DEMO, json=body)
                assert tagged.status_code == 400, tagged.text
                error = tagged.json()["error"]
                assert error["param"] == "image" and "is a tag" in error["message"], error

            # integrations pass the job create's own check: mlflow is configured here, a block lacking its
            # experiment is refused naming the field
            tracked = {"type": "mlflow", "mlflow": {"experiment_name": "house"}}
            mlflow = await http.post("/v1/templates", auth=DEMO, json={"name": "sft-mlflow", "model": tiny_model,
                                                                       "integrations": [tracked]})
            assert mlflow.status_code == 200 and mlflow.json()["template"]["integrations"] == [tracked], mlflow.text
            stray = await http.post("/v1/templates", auth=DEMO, json={
                "name": "sft-mlflow", "model": tiny_model,
                "integrations": [{"type": "mlflow", "mlflow": {"run_name": "x"}}]})
            assert stray.status_code == 400, stray.text
            assert stray.json()["error"]["param"] == "integrations[0].mlflow.experiment_name"

            # job.queued carries the template for the registry's lineage
            async def queued() -> list[dict]:
                rows = [e["payload"] for e in await outbox(rt, "job.queued")]
                return rows if len(rows) == 3 else None
            events = {e["job_id"]: e for e in await wait_until(queued, 30, "job.queued x3")}
            assert events[imaged["id"]]["spec"]["image"] == pin and events[view["id"]]["spec"].get("image") is None
            assert events[view["id"]]["job_template"] == "sft-base"
            assert events[view["id"]]["job_template_version"] == "2"
            assert events[old["id"]]["job_template_version"] == "1"
            assert events[old["id"]]["spec"]["eval_config"] == {"stages": ["holdout"]}

            # another tenant: its own namespace, never ours
            for path in ("/v1/templates/sft-base", "/v1/templates/sft-base/versions/1"):
                assert (await http.get(path, auth=ACME)).status_code == 404
            assert (await http.get("/v1/templates", auth=ACME)).json()["data"] == []
            theirs = await http.post("/v1/fine_tuning/jobs", auth=ACME,
                                     json={"template": "sft-base", "training_file": "file-t"})
            assert theirs.status_code == 404 and theirs.json()["error"]["param"] == "template"
            missing = await http.post("/v1/fine_tuning/jobs", auth=DEMO,
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
                r = await http.post("/v1/templates", auth=DEMO, json=body)
                assert r.status_code == 400, (body, r.text)
                assert r.json()["error"]["param"].startswith(param), (body, r.json())
            broken = await http.post("/v1/templates", auth=DEMO, headers=yaml_headers, content="name: x\nmodel: [unclosed\n")
            assert broken.status_code == 400 and broken.json()["error"]["param"] == "body"
            assert "line" in broken.json()["error"]["message"]
            # nested aliases (once 22 s of the scheduler and a 500, holding every other request): refused at once
            levels = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'] + [
                f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 9)]
            bomb = await http.post("/v1/templates", auth=DEMO, headers=yaml_headers,
                                   content=f"name: x\nmodel: {tiny_model}\neval_config:\n  " + "\n  ".join(levels))
            assert bomb.status_code == 400 and "aliases" in bomb.json()["error"]["message"], bomb.text
            assert (await http.get("/v1/templates/x", auth=DEMO)).status_code == 404
            # a job naming a template still gets the job rules: a bad override is a 400 naming it
            r = await http.post("/v1/fine_tuning/jobs", auth=DEMO, json={
                "template": "sft-base", "training_file": "file-t", "hyperparameters": {"n_epochs": 0}})
            assert r.status_code == 400 and "n_epochs" in r.json()["error"]["param"]
            r = await http.post("/v1/fine_tuning/jobs", auth=DEMO, json={"training_file": "file-t"})
            assert r.status_code == 400 and r.json()["error"]["param"] == "model"


class Receiver:
    """A webhook receiver on loopback (the test platform allow-lists 127.0.0.1): checks each
    signature, fails the first `failures` calls of each event with a 500. `behaviour` "stream"
    answers 200 and then a body without end; "silent" answers after the sender's deadline."""

    def __init__(self, failures: int = 0, status: int = 200, behaviour: str = "") -> None:
        self.failures, self.status, self.behaviour = failures, status, behaviour
        self.secret = ""
        self.calls: list[dict] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.calls.append({"body": json.loads(body), "event_id": request.headers.get("Whetstone-Event-Id"),
                           "signed": verify(self.secret, request.headers.get("Whetstone-Signature", ""), body),
                           "t": int(request.headers.get("Whetstone-Signature", "t=0,").split(",")[0][2:]),
                           "host": request.headers.get("Host")})
        if sum(c["event_id"] == self.calls[-1]["event_id"] for c in self.calls) <= self.failures:
            return web.Response(status=500, text="not yet: internal detail SECRET-RECEIVER-TEXT")
        if self.status in (301, 302, 307):
            return web.Response(status=self.status, headers={"Location": "http://127.0.0.1:9/elsewhere"},
                                text="SECRET-RECEIVER-TEXT")
        if self.behaviour == "silent":
            await asyncio.sleep(4)
        if self.behaviour == "stream":   # a body without end: the sender must not read it
            resp = web.StreamResponse(status=200)
            await resp.prepare(request)
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                for _ in range(200):
                    await resp.write(b"x" * 65536)
                    await asyncio.sleep(0.05)
            return resp
        return web.Response(status=self.status, text="ok")


class Resolver:
    """Stands in for DNS (nothing leaves this machine): names -> loopback answers; `rebind` names
    answer 127.0.0.1 the first time (registration) and 127.0.0.2 (not allow-listed) afterwards."""

    def __init__(self, names: list[str], rebind: list[str]) -> None:
        self.names, self.rebind = names, rebind
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        if host in self.rebind:
            return ["127.0.0.1"] if self.asked.count(host) == 1 else ["127.0.0.2"]
        if host in self.names:
            return ["127.0.0.1"]
        raise OSError(f"{host} unknown to the test resolver")


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


# addresses inside the platform or the network: each must be refused at registration, never stored
INSIDE = ["http://127.0.0.1:8100/internal/keys/verify", "http://169.254.169.254/latest/meta-data/",
          "http://[::1]:8000/", "http://0x7f000001:8104/", "http://2130706433:8100/", "http://10.0.0.1/",
          "http://[::ffff:127.0.0.1]:8100/", "http://localhost:8100/", "http://scheduler:8100/"]


async def test_webhooks_signed_retried_logged_and_filtered(platform, settings, tiny_model):
    flaky, quiet, redirect = Receiver(failures=2), Receiver(), Receiver(status=302)
    named, rebound, streamer, silent = Receiver(), Receiver(), Receiver(behaviour="stream"), Receiver(behaviour="silent")
    runner = await serve(flaky, quiet, redirect, named, rebound, streamer, silent)
    port = int(flaky.url.rsplit(":", 1)[1].split("/")[0])
    named.url = f"http://hooks.example.test:{port}/hook3"      # a name: resolved, then pinned
    rebound.url = f"http://rebind.example.test:{port}/hook4"   # a name that resolves elsewhere after registration
    resolver = Resolver(["hooks.example.test"], ["rebind.example.test"])
    # only the loopback address and port the receivers listen on is allow-listed (127.0.0.2 is not)
    cfg = SchedulerSettings(node_timeout_s=300, webhook_backoff_s=0.3, webhook_poll_s=0.1, webhook_max_attempts=3,
                            webhook_timeout_s=2, webhook_allow_hosts=[f"127.0.0.1:{port}"], webhook_max_per_tenant=7)

    def build():
        service = build_service(cfg)
        service.context.resolve_host = resolver
        return service

    try:
        async with platform(build) as p, httpx.AsyncClient(base_url=p.url("scheduler")) as http:
            rt, DEMO, ACME = p["scheduler"], tenant("demo"), tenant("acme")
            for url in INSIDE:   # refused as written: no address is asked about, nothing stored
                r = await http.post("/v1/webhooks", auth=ACME, json={"url": url})
                assert r.status_code == 400 and r.json()["error"]["param"] == "url", (url, r.text)
            assert resolver.asked == [] and await rt.pool.fetchval("SELECT count(*) FROM webhooks") == 0
            hooks = {}
            for name, receiver, events in (("flaky", flaky, ["job.cancelled", "model.registered", "model.promoted"]),
                                           ("quiet", quiet, ["job.succeeded"]),
                                           ("redirect", redirect, ["job.cancelled"]),
                                           ("named", named, ["job.cancelled"]), ("rebound", rebound, ["job.cancelled"]),
                                           ("streamer", streamer, ["job.cancelled"]),
                                           ("silent", silent, ["job.cancelled"])):
                r = await http.post("/v1/webhooks", auth=DEMO, json={"url": receiver.url, "events": events})
                assert r.status_code == 200, r.text
                receiver.secret = r.json()["secret"]
                hooks[name] = r.json()["id"]
            listed = (await http.get("/v1/webhooks", auth=DEMO)).json()["data"]
            assert {h["id"] for h in listed} == set(hooks.values()) and all("secret" not in h for h in listed)
            assert list(r.json()) == ["object", "id", "url", "events", "description", "created_at", "secret"]
            assert (await http.get(f"/v1/webhooks/{hooks['silent']}", auth=DEMO)).json() == \
                {k: v for k, v in r.json().items() if k != "secret"} == listed[-1]
            # at rest the signing secrets are sealed (the deliveries below still verify with the shown ones)
            stored = [r["secret"] for r in await rt.pool.fetch("SELECT secret FROM webhooks")]
            assert stored and all(v.startswith("enc:v1:") and "whsec_" not in v for v in stored)
            assert not {v for v in stored} & {receiver.secret for receiver in (flaky, quiet, named, silent)}
            for body, param in (({"url": "ftp://example.com/x"}, "url"), ({"url": "file:///etc/passwd"}, "url"),
                                ({"url": flaky.url, "events": ["job.exploded"]}, "events.0"),
                                ({"url": f"http://unknown.example.test:{port}/x"}, "url")):
                r = await http.post("/v1/webhooks", auth=ACME, json=body)
                assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
            capped = await http.post("/v1/webhooks", auth=DEMO, json={"url": quiet.url})   # the eighth
            assert capped.status_code == 400 and capped.json()["error"]["code"] == "webhook_limit_reached"
            assert (await http.post("/v1/webhooks", auth=ACME, json={"url": quiet.url, "events": ["job.succeeded"]})
                    ).status_code == 200                                                    # the cap is per tenant

            job = (await http.post("/v1/fine_tuning/jobs", auth=DEMO,
                                   json={"model": tiny_model, "training_file": "ds-never"})).json()
            cancelled = await http.post(f"/v1/fine_tuning/jobs/{job['id']}/cancel", auth=DEMO)
            assert cancelled.status_code == 200, cancelled.text
            await send_event(settings.kafka_bootstrap, ModelRegisteredV1(
                model_id="mdl-9", name="tiny-llama-9", stage="staging", artifact_uri="s3://b/a", artifact_sha256="1" * 64,
                lineage=Lineage(job_id=job["id"], base_model=tiny_model, base_model_sha256="2" * 64,
                                dataset_id="file-never", dataset_version="cd" * 32, method="lora",
                                hyperparameters_hash="3" * 64)), "demo", times=2)   # a redelivery: sent once
            await send_event(settings.kafka_bootstrap, ModelPromotedV1(
                model_id="mdl-8", from_stage="staging", to_stage="production", reason="ok"), "acme")

            async def log(name: str, expect: int) -> list[dict] | None:
                r = await http.get(f"/v1/webhooks/{hooks[name]}/deliveries", auth=DEMO)
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
            assert not any("SECRET" in (d["last_error"] or "") or "elsewhere" in (d["last_error"] or "")
                           for d in deliveries.values()) and red["last_error"] == "HTTP 3xx (redirects are not followed)"
            # a name is resolved once per attempt and the connection goes to that address, the name in Host
            got = (await wait_until(lambda: log("named", 1), 30, "named log"))[0]
            assert got["status"] == "succeeded" and named.calls[0]["host"] == f"hooks.example.test:{port}"
            # resolved to an allowed address at registration, elsewhere at delivery: never connected
            bad = (await wait_until(lambda: log("rebound", 1), 30, "rebound log"))[0]
            assert bad["status"] == "failed" and bad["last_status_code"] is None and rebound.calls == []
            assert bad["last_error"] == "refused: the URL's host is not a public address"
            # the receiver's body is never read (an endless one costs nothing); one deadline for the whole attempt
            streamed = (await wait_until(lambda: log("streamer", 1), 30, "streamer log"))[0]
            assert list(streamed) == ["object", "id", "webhook_id", "event_id", "event_type", "status", "attempts",
                                      "last_status_code", "last_error", "next_attempt_at", "created_at", "updated_at"]
            assert streamed["object"] == "webhook.delivery" and streamed["next_attempt_at"] is None
            assert streamed["status"] == "succeeded" and streamed["attempts"] == 1
            late = (await wait_until(lambda: log("silent", 1), 40, "silent log"))[0]
            assert late["status"] == "failed" and late["last_error"] == "no answer within 2 s"

            # another tenant sees none of it; a deleted hook gets nothing more
            assert (await http.get(f"/v1/webhooks/{hooks['flaky']}/deliveries", auth=ACME)).status_code == 404
            assert (await http.delete(f"/v1/webhooks/{hooks['flaky']}", auth=ACME)).status_code == 404
            assert (await http.delete(f"/v1/webhooks/{hooks['flaky']}", auth=DEMO)).json() == \
                {"object": "webhook.deleted", "id": hooks["flaky"], "deleted": True}
            assert (await http.get(f"/v1/webhooks/{hooks['flaky']}", auth=DEMO)).status_code == 404
            assert await rt.pool.fetchval("SELECT count(*) FROM webhook_deliveries") == 7
    finally:
        await runner.cleanup()
