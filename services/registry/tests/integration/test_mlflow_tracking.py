"""Experiment tracking against a real `mlflow server` (from .venv-mlflow) that is DOWN while the job's events
arrive: the registry keeps consuming (the job registers), queues each step once (a redelivered event and a
re-reported step add nothing), records the failed tries, and once the server is up sends everything to one run.
The end-to-end path (the official client, a real training job) is in tests/integration/test_openai_models.py."""

import httpx
import pytest

from whetstone.contracts import Integration, JobProgressV1, JobQueuedV1, Resources, TrainingSpec
from whetstone.devstack.mlflow_server import free_port, mlflow_executable, mlflow_server
from whetstone.devstack.testing import send_event, until, wait_until
from whetstone.registry.bootstrap import build_service

pytestmark = pytest.mark.integration
API = "/api/2.0/mlflow"


async def test_a_tracking_server_that_is_down_delays_the_run_and_loses_nothing(platform, kit, monkeypatch, tmp_path):
    exe = mlflow_executable()
    if exe is None:
        pytest.skip("no .venv-mlflow: deploy/tools/ensure-mlflow.sh could not install mlflow here")
    port = free_port()
    monkeypatch.setenv("WHETSTONE_MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("WHETSTONE_REGISTRY_MLFLOW_RETRY_S", "0.5")
    monkeypatch.setenv("WHETSTONE_REGISTRY_MLFLOW_RETRY_MAX_S", "2")
    monkeypatch.setenv("WHETSTONE_REGISTRY_MLFLOW_GIVE_UP_AFTER", "100000")   # however slow its start
    async with platform(build_service) as p:
        rt, b, job = p["registry"], p.settings.kafka_bootstrap, "ftjob-tracked"
        spec = TrainingSpec(base_model=kit.BASE, base_model_sha256=kit.BASE_SHA, dataset_id="ds-1",
                            dataset_version="b" * 64, train_uri="s3://whetstone/x", method="lora",
                            hyperparameters={"n_epochs": 1, "lora_r": 8}, hyperparameters_hash="c" * 64)
        mlflow = Integration.model_validate({"type": "mlflow", "mlflow": {"experiment_name": "down"}})
        await send_event(b, JobQueuedV1(job_id=job, tier="standard", spec=spec, integrations=[mlflow],
                                        resources=Resources(gpu_type="cpu", gpus_per_node=1)), "demo")
        await send_event(b, JobProgressV1(job_id=job, segment_id="s1", step=1, loss=3.0), "demo", times=2)
        await send_event(b, JobProgressV1(job_id=job, segment_id="s1", step=2, loss=2.5), "demo")
        await send_event(b, JobProgressV1(job_id=job, segment_id="s1", step=1, loss=9.9), "demo")  # re-reported

        # the server is down: the tries are recorded, the consumer goes on (the job registers)
        async def failing():
            return await rt.pool.fetchval("SELECT attempts >= 2 AND NOT given_up AND last_error LIKE '%Connect%'"
                                          " FROM tracked_runs WHERE job_id = $1", job)
        await wait_until(failing, 30, "failed tries recorded")
        model_id = await kit.register(p, job, eval_last=True)   # registered by the eval.completed handler

        async def queued_all():   # each topic is consumed on its own: the steps may come after the registration
            items = await rt.pool.fetch("SELECT item FROM tracking_items WHERE job_id = $1 AND sent_at IS NULL", job)
            return {r["item"] for r in items} >= {"params", "step:1", "step:2", "card", "end"}
        await wait_until(queued_all, 30, "every item queued while the server is down")
        order = [r["item"] for r in await rt.pool.fetch(
            "SELECT item FROM tracking_items WHERE job_id = $1 AND item NOT LIKE 'step:%' ORDER BY seq", job)]
        assert order[-1] == "end" and [i for i in order if i.startswith("verdict:")], order   # verdict before end

        async with mlflow_server(tmp_path / "mlflow", exe, port=port) as server:
            async with httpx.AsyncClient(base_url=await server.ready(), timeout=60) as http:
                async def finished():
                    found = await http.get(f"{API}/experiments/get-by-name", params={"experiment_name": "demo/down"})
                    if found.status_code != 200:
                        return None
                    runs = (await http.post(f"{API}/runs/search", json={
                        "experiment_ids": [found.json()["experiment"]["experiment_id"]]})).json().get("runs", [])
                    return runs if runs and runs[0]["info"]["status"] == "FINISHED" else None

                [run] = await until(finished, bool, 180, "the run to finish")   # one run for the job
                history = (await http.get(f"{API}/metrics/get-history", params={
                    "run_id": run["info"]["run_id"], "metric_key": "train_loss"})).json()["metrics"]
                assert [(m["step"], m["value"]) for m in history] == [(1, 3.0), (2, 2.5)]
                params = {x["key"]: x["value"] for x in run["data"]["params"]}
                tags = {x["key"]: x["value"] for x in run["data"]["tags"]}
                assert (params["hp.lora_r"], tags["eval.verdict"], tags["whetstone.model_id"]) == ("8", "passed",
                                                                                                  model_id)
                root = run["info"]["artifact_uri"].removeprefix("mlflow-artifacts:/")
                card = await http.get(f"/api/2.0/mlflow-artifacts/artifacts/{root}/model_card/README.md")
                assert card.status_code == 200 and model_id in card.text
        assert await rt.pool.fetchval("SELECT count(*) FROM tracking_items WHERE job_id = $1 AND sent_at IS NULL",
                                      job) == 0
