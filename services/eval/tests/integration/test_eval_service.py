"""The eval service on the real embedded stack: claim -> worker -> stages -> outbox, leases, resume."""

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from whetstone.contracts import (
    CheckpointWrittenV1,
    EvalRequestedV1,
    EvalStageResult,
    JobQueuedV1,
    Resources,
    TrainingSpec,
)
from whetstone.devstack.testing import outbox, send_event, wait_until
from whetstone.eval.adapters.repository import PROBES, EvalStore, LeaseLost
from whetstone.eval.bootstrap import build_service
from whetstone.eval.config import EvalSettings
from whetstone.eval.domain.runs import Claim
from whetstone.runtime.checkpoints import upload_checkpoint
from whetstone.runtime.models import resolve_model

pytestmark = pytest.mark.integration
ROWS = [{"messages": [{"role": "user", "content": f"What is {a} + 2?"},
                      {"role": "assistant", "content": f"{a + 2}"}]} for a in range(5)]


def _artifacts(settings, store, tmp_path: Path):
    from peft import LoraConfig, get_peft_model
    from whetstone.modelkit.loading import load_model
    from whetstone.modelkit.tiny import build_tiny_model

    base = build_tiny_model(Path(settings.model_catalog) / "tiny-llama")
    model = get_peft_model(load_model(str(base)), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    model.save_pretrained(tmp_path / "adapter")
    up = upload_checkpoint(store, tmp_path / "adapter", "tenants/acme/jobs/final", {"job_id": "x"})
    (tmp_path / "v.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    validation = store.put_file("tenants/acme/datasets/v.jsonl", tmp_path / "v.jsonl")
    return resolve_model("tiny-llama", settings.model_catalog).sha256, up, validation


async def _submit(settings, job_id, sha, uri, manifest, validation, eval_config, times=1):
    spec = TrainingSpec(base_model="tiny-llama", base_model_sha256=sha, dataset_id="ds", dataset_version="v" * 64,
                        train_uri="s3://whetstone/t", validation_uri=validation, method="lora",
                        hyperparameters={}, hyperparameters_hash="h" * 64, eval_config=eval_config)
    b = settings.kafka_bootstrap
    await send_event(b, JobQueuedV1(job_id=job_id, tier="standard", spec=spec,
                                    resources=Resources(gpu_type="cpu", gpus_per_node=1)), "acme")
    await send_event(b, CheckpointWrittenV1(job_id=job_id, segment_id="s", checkpoint_id="c", kind="final", step=1,
                                            uri=uri, manifest_sha256=manifest, files=2, size_bytes=1,
                                            written_at=datetime.now(UTC)), "acme", times=times)


async def _completed(rt, job_id, timeout=180):
    async def done():
        return [e for e in await outbox(rt, "eval.completed") if e["payload"]["job_id"] == job_id]
    return await wait_until(done, timeout, f"eval.completed for {job_id}")


async def _record(rt, claim, result):
    async with rt.pool.acquire() as conn, conn.transaction():
        await EvalStore(conn).record_stage(claim, result)


def _service():
    return build_service(EvalSettings(lease_s=3, poll_s=0.2))


async def test_evaluation_is_claimed_run_by_the_worker_and_published_once(platform, settings, tmp_path):
    async with platform(_service) as p:
        rt = p["eval"]
        sha, up, validation = _artifacts(settings, rt.store, tmp_path)
        # a tier may not switch safety off: asked to, it runs anyway and the reasons say so
        config = {"stages": {"benchmarks": False, "judge": False, "safety": {"enabled": False}}}
        await _submit(settings, "job-1", sha, up.uri, up.manifest_sha256, validation, config, times=2)
        events = await _completed(rt, "job-1")
        ev = events[0]["payload"]
        stages = {s["name"]: s for s in ev["stages"]}
        assert list(stages) == ["benchmarks", "holdout", "safety", "judge"]
        assert stages["benchmarks"]["status"] == "skipped" and "disabled" in stages["benchmarks"]["reason"]
        assert stages["safety"]["status"] in ("passed", "failed") and stages["safety"]["details"]["prompts"] == 48
        assert stages["holdout"]["details"]["rows"] == len(ROWS)
        assert any("cannot be switched off on tier standard" in r for r in ev["reasons"])
        assert {m["name"] for m in ev["metrics"]} >= {"holdout_loss", "safety_refusal_rate"}
        assert ev["verdict"] == ("failed" if any(s["status"] == "failed" for s in ev["stages"]) else "passed")
        run = await rt.pool.fetchrow("SELECT status, attempts FROM eval_runs WHERE job_id = 'job-1'")
        assert dict(run) == {"status": "done", "attempts": 1}
        assert await rt.pool.fetchval("SELECT count(*) FROM eval_stage_results WHERE run_id = 'job-1'") == 4
        assert len(await _completed(rt, "job-1")) == 1  # the redelivered checkpoint did not evaluate twice

        # an adapter whose manifest hash does not match: blocked with the reason, nothing else run
        await _submit(settings, "job-2", sha, up.uri, "0" * 64, validation, None)
        bad = (await _completed(rt, "job-2"))[0]["payload"]
        assert bad["verdict"] == "failed" and bad["stages"][0]["name"] == "artifact"
        assert "manifest sha256 mismatch" in bad["stages"][0]["reason"]


async def test_a_dead_workers_claim_is_resumed_after_its_lease_never_doubled(platform, settings, tmp_path):
    async with platform(_service) as p:
        rt = p["eval"]
        sha, up, validation = _artifacts(settings, rt.store, tmp_path)
        spec = TrainingSpec(base_model="tiny-llama", base_model_sha256=sha, dataset_id="ds", dataset_version="v",
                            train_uri="s3://whetstone/t", validation_uri=validation, method="lora", hyperparameters={},
                            hyperparameters_hash="h", eval_config={"stages": {"benchmarks": False, "judge": False}})
        # state as a worker that died mid-evaluation left it: claimed, lease live, one stage recorded
        await rt.pool.execute("INSERT INTO jobs (job_id, tenant_id, spec, tier) VALUES ('job-3', 'acme', $1, 'standard')",
                              spec.model_dump(mode="json"))
        await rt.pool.execute("INSERT INTO final_checkpoints VALUES ('job-3', 'acme', $1, $2, 'trace-3')",
                              up.uri, up.manifest_sha256)
        await rt.pool.execute("INSERT INTO eval_runs (run_id, job_id, tenant_id, status, attempts, lease_owner,"
                              " lease_until) VALUES ('job-3', 'job-3', 'acme', 'running', 1, 'dead-worker',"
                              " now() + interval '5 seconds')")
        recorded = EvalStageResult(name="holdout", status="passed", reason="recorded by the dead worker")
        dead = Claim("job-3", "acme", 1, "dead-worker", job_id="job-3")
        await _record(rt, dead, recorded)
        # while the lease is live nobody else can claim it or record for it
        async with rt.pool.acquire() as conn:
            assert await EvalStore(conn).claim_next("intruder", 30) is None
        (queued,) = PROBES                          # the queue KEDA scales eval on
        assert dict(await rt.pool.fetch(queued.sql)) == {"running": 1}
        with pytest.raises(LeaseLost):
            await _record(rt, Claim("job-3", "acme", 1, "intruder", job_id="job-3"), recorded)
        # the lease runs out (no heartbeat): the live worker claims it and resumes after the recorded stage
        events = await _completed(rt, "job-3", timeout=120)
        stages = {s["name"]: s for s in events[0]["payload"]["stages"]}
        assert stages["holdout"]["reason"] == "recorded by the dead worker"   # not re-run
        assert stages["safety"]["status"] in ("passed", "failed")              # run by the successor
        assert await rt.pool.fetchval("SELECT attempts FROM eval_runs WHERE job_id = 'job-3'") == 2
        # the dead worker, coming back, can neither record nor publish
        with pytest.raises(LeaseLost):
            await _record(rt, dead, recorded)
        assert len(await _completed(rt, "job-3")) == 1


async def test_eval_requested_is_answered_once_per_request_and_never_on_other_base_weights(platform, settings,
                                                                                          tmp_path):
    # the tier may skip safety here: only the holdout stage runs, the job's own eval and its re-eval alike
    async with platform(lambda: build_service(EvalSettings(lease_s=3, poll_s=0.2,
                                                           tiers_may_skip_safety=["standard"]))) as p:
        rt = p["eval"]
        sha, up, validation = _artifacts(settings, rt.store, tmp_path)
        await _submit(settings, "job-r", sha, up.uri, up.manifest_sha256, validation, {"stages": ["holdout"]})
        await _completed(rt, "job-r")

        def request(request_id, base_sha):
            return EvalRequestedV1(request_id=request_id, job_id="job-r", model_id="m-1", checkpoint_uri=up.uri,
                                   manifest_sha256=up.manifest_sha256, base_model="tiny-llama",
                                   base_model_sha256=base_sha, previous_base_model_sha256="a" * 64)

        b = settings.kafka_bootstrap
        await send_event(b, request("req-ok", sha), "acme", times=2)        # redelivered
        await send_event(b, request("req-drift", "f" * 64), "acme")         # the catalog's weights are not f...
        await send_event(b, request("req-foreign", sha), "other")           # another tenant's adapter
        answers = await wait_until(lambda: _answers(rt, 3), 180, "3 eval.completed for job-r")
        by_request = {a["payload"]["request_id"]: a for a in answers}
        assert len(by_request) == 3 and None in by_request                  # the job's own eval coexists

        ok = by_request["req-ok"]
        assert ok["tenant_id"] == "acme" and ok["payload"]["base_model_sha256"] == sha
        stages = {s["name"]: s for s in ok["payload"]["stages"]}
        assert stages["holdout"]["status"] in ("passed", "failed")          # scored on the job's validation file
        assert stages["holdout"]["details"]["rows"] == len(ROWS)
        assert stages["safety"]["status"] == "skipped"                      # the job's eval_config applied

        drift = by_request["req-drift"]["payload"]
        assert drift["verdict"] == "failed" and drift["base_model_sha256"] == "f" * 64
        assert drift["stages"][0]["name"] == "base_model"
        assert f"sha256 {sha[:12]}, not the pinned {'f' * 12}" in drift["stages"][0]["reason"]
        assert all(s["status"] == "skipped" for s in drift["stages"][1:])   # nothing run on other weights

        # another tenant naming acme's job is refused before any work: a dead letter with the reason
        letters = await wait_until(lambda: outbox(rt, "eval.requested.dlq"), 30, "the foreign request dead-lettered")
        assert len(letters) == 1 and "tenant_mismatch" in letters[0]["payload"]["error"]

        # the later requests on the same partition were answered, so the duplicate was consumed: one answer
        assert len(await _answers(rt, 0)) == 3
        runs = await rt.pool.fetch("SELECT run_id, status FROM eval_runs WHERE job_id = 'job-r' ORDER BY run_id")
        assert [r["status"] for r in runs] == ["done"] * 3


async def _answers(rt, at_least):
    events = [e for e in await outbox(rt, "eval.completed") if e["payload"]["job_id"] == "job-r"]
    return events if len(events) >= at_least else None
