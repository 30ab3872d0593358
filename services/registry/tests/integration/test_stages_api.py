"""Stages through the API: approvals, one production version per name, rollback, archive, the
append-only history, tenant isolation, a promotion race — against the real embedded stack."""

import asyncio
import json
import tempfile
from pathlib import Path

import asyncpg
import httpx
import pytest
from openai import AsyncOpenAI, NotFoundError, PermissionDeniedError

from whetstone.contracts import Metric, fine_tuned_model_for
from whetstone.devstack.testing import outbox
from whetstone.registry.bootstrap import build_service
from whetstone.runtime.checkpoints import download_checkpoint

pytestmark = pytest.mark.integration
PROMOTER = ("read", "write", "models:promote")


async def test_lifecycle_promote_replace_rollback_archive(platform, kit):
    async with platform(build_service) as p:
        rt = p["registry"]
        v1 = await kit.register(p, "ftjob-v1", times=2)  # duplicates: one model, one history
        v2 = await kit.register(p, "ftjob-v2")
        bad = await kit.register(p, "ftjob-bad", verdict="failed")
        alone = await kit.register(p, "ftjob-alone", suffix="other")
        async with httpx.AsyncClient(base_url=p.url("registry")) as c:
            writer, promoter = kit.auth("demo"), kit.auth("demo", *PROMOTER)
            view = (await c.get(f"/v1/models/{v1}", auth=writer)).json()
            assert view["object"] == "model" and view["owned_by"] == "demo" and view["stage"] == "staging"
            assert [h["to_stage"] for h in view["stage_history"]] == ["dev", "staging"]
            lineage = view["lineage"]
            assert lineage["base_model_sha256"] == kit.BASE_SHA and lineage["training_run"] == "ftjob-v1-s1"
            assert lineage["environment"]["packages"]["whetstone-registry"] and lineage["environment_sha256"]
            assert lineage["job_template"] is None and lineage["job_template_missing_reason"]
            assert set(lineage["files"]) >= {"adapter_model.safetensors", "adapter_config.json"}
            assert lineage["chat_template_sha256"]
            card = rt.store.get_bytes(lineage["model_card_uri"]).decode()
            assert card.startswith("---\nbase_model: tiny-llama\n") and "model-index:" in card
            # writing the card and lockfile left the training artifact exactly as its manifest lists it
            with tempfile.TemporaryDirectory() as tmp:
                download_checkpoint(rt.store, view["artifact_uri"], Path(tmp), view["artifact_sha256"])
            lock = json.loads(rt.store.get_bytes(lineage["model_card_uri"].replace("README.md", "environment.lock.json")))
            assert lock["packages"] == lineage["environment"]["packages"]

            # production needs an approval: a writer with thin eval margins is refused
            r = await c.post(f"/v1/models/{v1}/promote", json={"stage": "production", "reason": "go"}, auth=writer)
            assert r.status_code == 403 and r.json()["error"]["code"] == "approval_required"
            reader = kit.auth("demo", "read")
            r = await c.post(f"/v1/models/{v1}/promote", json={"stage": "production", "reason": "go"}, auth=reader)
            assert r.status_code == 403 and "models:promote" in r.json()["error"]["message"], r.json()
            # the models:promote scope alone is enough
            only_promote = kit.auth("demo", "models:promote")
            r = await c.post(f"/v1/models/{v1}/promote", json={"stage": "production", "reason": "go"},
                             auth=only_promote)
            assert r.status_code == 200 and r.json()["stage"] == "production", r.json()
            assert r.json()["stage_history"][-1]["approval"] == "manual"
            # v2 replaces v1 in the same transaction
            r = await c.post(f"/v1/models/{v2}/promote", json={"stage": "production", "reason": "v2"}, auth=promoter)
            assert r.status_code == 200
            stages = dict(await rt.pool.fetch("SELECT model_id, stage FROM models WHERE model_id = ANY($1)", [v1, v2]))
            assert stages == {v1: "archived", v2: "production"}
            # rollback: v1 back, v2 archived, in one step
            r = await c.post(f"/v1/models/{v2}/rollback", json={"reason": "bad answers"}, auth=promoter)
            assert r.status_code == 200 and (r.json()["model_id"], r.json()["stage"]) == (v1, "production")
            assert (await c.get(f"/v1/models/{v2}", auth=writer)).json()["stage"] == "archived"
            # bad input
            r = await c.post(f"/v1/models/{v1}/rollback", json={"reason": "x"}, auth=writer)
            assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_scope"
            r = await c.post(f"/v1/models/{alone}/promote", json={"stage": "production", "reason": "x"}, auth=promoter)
            r = await c.post(f"/v1/models/{alone}/rollback", json={"reason": "x"}, auth=promoter)
            assert r.status_code == 409 and r.json()["error"]["code"] == "no_previous_version"
            assert r.headers["x-should-retry"] == "false"
            r = await c.post(f"/v1/models/{bad}/promote", json={"stage": "production", "reason": "x"}, auth=promoter)
            assert r.status_code == 409 and r.json()["error"]["code"] == "model_quarantined"
            r = await c.post(f"/v1/models/{v1}/promote", json={"stage": "prod", "reason": "x"}, auth=promoter)
            assert r.status_code == 400 and r.json()["error"]["param"] == "stage"
            for path in (f"/v1/models/{v1}", f"/v1/models/{v1}/content"):
                r = await c.get(path, auth=kit.auth("acme", *PROMOTER))
                assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
            r = await c.post(f"/v1/models/{v1}/promote", json={"stage": "archived", "reason": "x"},
                             auth=kit.auth("acme", *PROMOTER))
            assert r.status_code == 404
            assert (await c.get("/v1/models")).status_code == 401
            # archiving production needs the promote scope
            r = await c.post(f"/v1/models/{v1}/archive", json={"reason": "x"}, auth=writer)
            assert r.status_code == 403
            r = await c.post(f"/v1/models/{bad}/archive", json={"reason": "cleanup"}, auth=writer)
            assert r.status_code == 200 and r.json()["stage"] == "archived"

        # history rows == events, and the history is insert-only
        rows = await rt.pool.fetchval("SELECT count(*) FROM stage_history WHERE from_stage IS NOT NULL")
        events = await outbox(rt, "model.promoted")
        assert len(events) == rows
        assert await rt.pool.fetchval("SELECT count(*) FROM stage_history WHERE model_id = $1 AND to_stage = 'dev'",
                                      v1) == 1
        last = [e["payload"] for e in events if e["payload"]["model_id"] == v1][-1]
        assert last["to_stage"] == "production" and last["name"] == "ft:tiny-llama:demo:support"
        assert last["artifact_uri"] and last["files"]["adapter_model.safetensors"]
        assert last["base_model_sha256"] == kit.BASE_SHA and last["chat_template_sha256"]
        assert last["approval"] == "manual" and last["replaces_model_id"] == v2
        with pytest.raises(asyncpg.PostgresError, match="append-only"):
            await rt.pool.execute("UPDATE stage_history SET reason = 'rewritten'")
        with pytest.raises(asyncpg.PostgresError, match="append-only"):
            await rt.pool.execute("DELETE FROM stage_history")


async def test_auto_promotion_openai_client_and_a_promotion_race(platform, kit):
    async with platform(build_service) as p:
        rt = p["registry"]
        wide = [Metric(name="holdout_loss", base=2.0, candidate=1.0)]
        auto = await kit.register(p, "ftjob-auto", suffix="auto", metrics=wide)
        first = await kit.register(p, "ftjob-r1")
        second = await kit.register(p, "ftjob-r2")
        async with httpx.AsyncClient(base_url=p.url("registry")) as c:
            # a writer without the promote scope: the auto-promotion policy approves wide margins
            r = await c.post(f"/v1/models/{auto}/promote", json={"stage": "production", "reason": "auto"},
                             auth=kit.auth("demo"))
            assert r.status_code == 200, r.text
            assert r.json()["stage_history"][-1]["approval"] == "auto"

            async def go(model_id):
                return await c.post(f"/v1/models/{model_id}/promote", json={"stage": "production", "reason": "race"},
                                    auth=kit.auth("demo", *PROMOTER))
            results = await asyncio.gather(go(first), go(second), go(second))
        codes = sorted(r.status_code for r in results)
        assert codes == [200, 200, 409], [r.text for r in results]
        assert await rt.pool.fetchval("SELECT count(*) FROM models WHERE stage = 'production'"
                                      " AND name = 'ft:tiny-llama:demo:support'") == 1

        client = AsyncOpenAI(base_url=p.url("registry") + "/v1", api_key="unused",
                             http_client=httpx.AsyncClient(auth=kit.auth("demo", *PROMOTER), timeout=60), max_retries=0)
        # OpenAI's ids: a version is listed, retrieved and deleted by its job's `fine_tuned_model`; the
        # internal id stays a field (and still resolves); the platform's bases follow the tenant's models
        listed = await client.models.list()
        public = {m.model_extra["model_id"]: m.id for m in listed.data if m.owned_by == "demo"}
        assert set(public) == {auto, first, second}
        assert public[second] == fine_tuned_model_for("tiny-llama", "demo", "support", "ftjob-r2")
        assert public[auto] == fine_tuned_model_for("tiny-llama", "demo", "auto", "ftjob-auto")
        assert [(m.id, m.model_extra["model_type"]) for m in listed.data if m.owned_by == "whetstone"] == \
            [("tiny-llama", "base")]
        one = await client.models.retrieve(public[second])
        assert one.object == "model" and one.owned_by == "demo" and one.model_extra["lineage"]
        assert one.id == public[second] and one.model_extra["model_id"] == second
        assert (await client.models.retrieve(second)).id == public[second]
        assert (await client.models.retrieve("tiny-llama")).owned_by == "whetstone"
        with pytest.raises(PermissionDeniedError):   # the platform's base is not the tenant's to delete
            await client.models.delete("tiny-llama")
        deleted = await client.models.delete(public[second])
        assert deleted.deleted and deleted.id == public[second]
        assert (await client.models.retrieve(public[second])).model_extra["stage"] == "archived"
        with pytest.raises(NotFoundError):
            await client.models.retrieve("wsm-nope")
        with pytest.raises(NotFoundError):
            await client.models.retrieve(fine_tuned_model_for("tiny-llama", "acme", "support", "ftjob-r2"))
