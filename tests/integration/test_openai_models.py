"""OpenAI's model ids, results files and "auto" hyperparameters through the real platform, with the official
`openai` client on the gateway:

- `/v1/models` lists the platform's base and, once trained, the job's model under the job's
  `fine_tuned_model`; `models.retrieve(job.fine_tuned_model)` and `models.delete(...)` (archive) work;
- the base answers chat completions; the fine-tuned model and its checkpoints
  (`fine_tuned_model_checkpoint`) do once the model is live;
- `"auto"` epochs, batch size, learning rate and LoRA rank are resolved from the data and the base and
  echoed in `method.supervised.hyperparameters`; `"auto"` epochs on 5 examples is refused naming the field;
- the job's `result_files` holds a CSV in OpenAI's columns, read with `files.content`, and (its `wandb`
  integration, offline) a W&B offline run of the same steps, read back with the SDK's own reader;
- `whet jobs reproduce JOB` trains it again with everything pinned (files, base sha256, resolved
  hyperparameters and seed): the same loss at every step; a base pin that no longer holds is a 409;
- the job's `mlflow` integration: a real `mlflow server` (from .venv-mlflow) holds the job's run, read back
  through MLflow's REST API: params, the train-loss history, the gate's verdict and the model card."""

import asyncio
import contextlib
import csv
import io
import json
import re
from pathlib import Path

import httpx
import openai
import pytest

from whetstone.cli.dev import all_service_builders, upstreams_of
from whetstone.devstack.mlflow_server import MlflowProcess, mlflow_executable, mlflow_server
from whetstone.devstack.testing import until
from whetstone.devstack.wandb_runs import read_offline_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]  # two jobs through the whole platform
TERMINAL = ("succeeded", "failed", "cancelled")
HELLO = [{"role": "user", "content": "What is 2 + 3?"}]


def sft_rows(n: int) -> bytes:
    rows = [{"messages": [{"role": "user", "content": f"What is {i} + {i + 2}?"},
                          {"role": "assistant", "content": f"{i} + {i + 2} = {2 * i + 2}."}]} for i in range(n)]
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


async def test_model_ids_auto_hyperparameters_and_result_files(platform, settings, monkeypatch, openai_clients,
                                                              tmp_path):
    from whetstone.modelkit.tiny import build_tiny_model

    monkeypatch.setenv("WHETSTONE_INGEST_MIN_EXAMPLES", "3")   # ingest's own floor (10, OpenAI's) let through

    exe = mlflow_executable()
    async with contextlib.AsyncExitStack() as servers:
        # the operator's tracking server (the scheduler and the registry read its URL) starts beside the
        # platform: the registry's tracker retries (every second here) until it answers
        tracking = None if exe is None else await servers.enter_async_context(mlflow_server(tmp_path / "mlflow", exe))
        if tracking is not None:
            monkeypatch.setenv("WHETSTONE_MLFLOW_TRACKING_URI", tracking.url)
            monkeypatch.setenv("WHETSTONE_REGISTRY_MLFLOW_RETRY_S", "1")
            monkeypatch.setenv("WHETSTONE_REGISTRY_MLFLOW_RETRY_MAX_S", "2")
            monkeypatch.setenv("WHETSTONE_REGISTRY_MLFLOW_GIVE_UP_AFTER", "100000")   # however slow its start
        await asyncio.to_thread(build_tiny_model, Path(settings.model_catalog) / "tiny-llama")
        async with platform(*all_service_builders()) as p:
            async with openai_clients(upstreams_of(p.runtimes.values())) as (client, other):
                await run(client, other, monkeypatch, tracking)
    if tracking is None:   # everything else was checked above
        pytest.skip("MLflow tracking not checked: no .venv-mlflow (deploy/tools/ensure-mlflow.sh could not install "
                    "mlflow here)")


async def processed(client: openai.AsyncOpenAI, data: bytes, name: str):
    f = await client.files.create(file=(name, data), purpose="fine-tune")
    f = await until(lambda: client.files.retrieve(f.id), lambda x: x.status != "uploaded", 120, f"validation of {name}")
    assert f.status == "processed", f
    return f


async def run(client: openai.AsyncOpenAI, other: openai.AsyncOpenAI, monkeypatch,
              tracking: MlflowProcess | None) -> None:
    # the platform's base, listed for every tenant and answering chat completions
    listed = await client.models.list()
    assert [(m.id, m.owned_by) for m in listed.data] == [("tiny-llama", "whetstone")]
    base = await client.chat.completions.create(model="tiny-llama", messages=HELLO, max_tokens=4, temperature=0)
    assert base.model == "tiny-llama" and base.choices[0].finish_reason in ("stop", "length")

    train, few = await asyncio.gather(processed(client, sft_rows(40), "train.jsonl"),
                                      processed(client, sft_rows(5), "few.jsonl"))
    auto = {"n_epochs": "auto", "batch_size": "auto", "learning_rate_multiplier": "auto"}
    # "auto" epochs cannot be chosen for 5 examples: refused naming the field; at once where the scheduler
    # has the file's verdict, else (its projection of dataset.validated still behind ingest) the job fails so
    await refused_for_too_few(client, few.id, auto)

    # epochs, batch size and LoRA rank "auto"; the learning rate the user's (a tiny random base learns
    # this data in the gate's eyes only at the demo's rate); the gate's holdout stage only, to keep it short
    job = await client.fine_tuning.jobs.create(
        model="tiny-llama", training_file=train.id, suffix="models",
        method={"type": "supervised", "supervised": {"hyperparameters": {
            "n_epochs": "auto", "batch_size": "auto", "learning_rate_multiplier": 50, "checkpoint_every_steps": 5,
            "max_seq_len": 128}}}, extra_body={"eval_config": {"stages": ["holdout"]}},
        integrations=[WANDB, *([MLFLOW] if tracking else [])])
    job = await until(lambda: client.fine_tuning.jobs.retrieve(job.id), lambda j: j.status in TERMINAL, 900,
                      f"job {job.id}")
    assert job.status == "succeeded", job
    # "auto", resolved at admission and echoed: 40 examples -> 3 epochs (40 x 3 >= 100), 8 per step,
    # rank 16 for a base under 10B parameters; the user's learning rate kept
    hp = job.method.supervised.hyperparameters
    assert (hp.n_epochs, hp.batch_size, hp.learning_rate_multiplier) == (3, 8, 50)
    extra = hp.model_extra
    assert (extra["lora_r"], extra["lora_alpha"], extra["learning_rate"]) == (16, 32, 1e-2)
    assert {"n_epochs", "batch_size", "lora_r", "lora_alpha"} <= set(extra["auto"])
    assert "learning_rate" not in extra["auto"]
    assert extra["micro_batch_size"] * extra["gradient_accumulation_steps"] == 8

    # OpenAI's id: the job's fine_tuned_model is the model's id everywhere
    job = await until(lambda: client.fine_tuning.jobs.retrieve(job.id), lambda j: j.fine_tuned_model, 60,
                      "fine_tuned_model")
    ftm = job.fine_tuned_model
    assert re.fullmatch(r"ft:tiny-llama:demo:models:[0-9a-f]{12}", ftm), ftm
    model = await client.models.retrieve(ftm)
    assert model.id == ftm and model.owned_by == "demo" and model.model_extra["model_id"].startswith("wsm-")
    ids = [m.id for m in (await client.models.list()).data]
    assert ids == [ftm, "tiny-llama"]
    with pytest.raises(openai.NotFoundError):
        await other.models.retrieve(ftm)

    # the model and its checkpoints answer once live (the gate passed: staging)
    assert model.model_extra["stage"] in ("staging", "production"), model.model_extra
    checkpoints = (await client.fine_tuning.jobs.checkpoints.list(job.id)).data
    names = {c.fine_tuned_model_checkpoint for c in checkpoints}
    assert names and all(n.startswith(ftm + ":ckpt-step-") for n in names), names
    periodic = sorted((c for c in checkpoints if c.model_extra.get("kind") == "periodic"), key=lambda c: c.step_number)
    assert periodic, checkpoints
    for name in (ftm, periodic[-1].fine_tuned_model_checkpoint):
        answer = await until(lambda name=name: answered(client, name), lambda a: a is not None, 60, f"{name} served")
        assert answer.model == name
    with pytest.raises(openai.NotFoundError):
        await other.chat.completions.create(model=ftm, messages=HELLO, max_tokens=2)

    # the results file: OpenAI's columns, one row per reported step, a file of the tenant's
    job = await until(lambda: client.fine_tuning.jobs.retrieve(job.id), lambda j: len(j.result_files) == 2, 90,
                      "result_files: the CSV and the W&B offline run")
    result_id, wandb_id = await result_kinds(client, job)
    result = await client.files.retrieve(result_id)
    assert (result.purpose, result.status) == ("fine-tune-results", "processed")
    rows = list(csv.DictReader(io.StringIO((await client.files.content(result_id)).text)))
    assert list(rows[0])[:5] == ["step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy"]
    steps = [int(r["step"]) for r in rows]
    final = max(c.step_number for c in checkpoints)
    assert len(steps) >= 2 and steps == sorted(set(steps)) and steps[-1] <= final, (steps, final)
    assert all(float(r["train_loss"]) > 0 for r in rows if r["train_loss"])
    with pytest.raises(openai.NotFoundError):
        await other.files.content(result_id)
    await wandb_run_checked(client, job, result_id, wandb_id)
    if tracking is not None:
        await mlflow_run_checked(await tracking.ready(), job, model.model_extra["model_id"])

    # reproduced by the CLI with everything pinned: same files, base, resolved hyperparameters (seed
    # included), and the same loss at every step (CPU training is deterministic for a given seed and data order)
    copy_id = await reproduce_with_cli(client, job.id, monkeypatch)
    copy = await until(lambda: client.fine_tuning.jobs.retrieve(copy_id), lambda j: j.status in TERMINAL, 900,
                       "the reproduced job")
    assert copy.status == "succeeded" and copy.metadata == {"reproduces": job.id}, copy
    assert (copy.model_extra["resolved_hyperparameters"], copy.model_extra["base_model_sha256"]) == (
        job.model_extra["resolved_hyperparameters"], job.model_extra["base_model_sha256"])
    assert (copy.training_file, copy.model_extra["dataset_version"]) == (job.training_file,
                                                                           job.model_extra["dataset_version"])
    copy = await until(lambda: client.fine_tuning.jobs.retrieve(copy.id), lambda j: j.result_files, 60,
                       "the copy's result_files")
    copy = await until(lambda: client.fine_tuning.jobs.retrieve(copy.id), lambda j: len(j.result_files) == 2, 90,
                       "the copy's W&B result file (its integrations reproduced)")
    again = list(csv.DictReader(io.StringIO((await client.files.content((await result_kinds(client, copy))[0])).text)))
    # the agent reports a sample of the steps (its stride follows the measured step time), and a row may carry
    # only a validation loss: compared on the steps whose training loss both reported (the first one always)
    first, second = ({r["step"]: r["train_loss"] for r in x if r["train_loss"]} for x in (rows, again))
    common = sorted(set(first) & set(second), key=int)
    assert len(common) >= 2 and common[0] == str(steps[0]), (common, steps)
    assert [first[s] for s in common] == [second[s] for s in common], (rows, again)
    # a pin that no longer holds (the catalog base changed since): refused, nothing created
    with pytest.raises(openai.ConflictError) as changed:
        await client.with_options(max_retries=0).fine_tuning.jobs.create(
            model="tiny-llama", training_file=train.id, extra_body={"base_model_sha256": "0" * 64})
    assert (changed.value.body["param"], changed.value.body["code"]) == ("base_model_sha256", "base_model_changed")

    # delete = archive: the id stays, out of serving
    deleted = await client.models.delete(ftm)
    assert deleted.deleted and deleted.id == ftm
    assert (await client.models.retrieve(ftm)).model_extra["stage"] == "archived"


MLFLOW = {"type": "mlflow", "mlflow": {"experiment_name": "models-test"}}
WANDB = {"type": "wandb", "wandb": {"project": "models-test", "tags": ["e2e"]}}


async def result_kinds(client: openai.AsyncOpenAI, job) -> tuple[str, str]:
    """(the results CSV's id, the W&B offline run's id): file.created events are read in no set order."""
    names = {(await client.files.retrieve(f)).filename: f for f in job.result_files}
    return names[f"{job.id}-results.csv"], names[f"{job.id}-wandb-offline.tar.gz"]


async def wandb_run_checked(client: openai.AsyncOpenAI, job, result_id: str, wandb_id: str) -> None:
    """The job's W&B offline run: named after the job, in the block's project, with the job's resolved
    hyperparameters and the results CSV's training losses at the same steps (the CSV rounds to 6 digits)."""
    assert [(i.type, i.wandb.project, i.wandb.tags) for i in job.integrations if i.type == "wandb"] == [
        ("wandb", "models-test", ["e2e"])]

    async def both():
        rows = list(csv.DictReader(io.StringIO((await client.files.content(result_id)).text)))
        run = read_offline_run((await client.files.content(wandb_id)).content)
        return (rows, run) if sorted(run.history) == [int(r["step"]) for r in rows] else None
    rows, run = await until(both, lambda x: x is not None, 60, "the W&B run with the CSV's steps")
    assert run.exit_code == 0 and (run.run.project, run.run.display_name) == ("models-test", job.id)
    assert run.config.hyperparameters == job.model_extra["resolved_hyperparameters"]
    losses = [(int(r["step"]), float(r["train_loss"])) for r in rows if r["train_loss"]]
    assert losses and all(run.history[s]["train_loss"] == pytest.approx(v, rel=1e-5) for s, v in losses)


async def mlflow_run_checked(tracking: str, job, model_id: str) -> None:
    """The job's run on the MLflow server, read through MLflow's REST API: made once under the tenant's
    experiment, with the resolved params, every reported step's train loss once, the verdict, the model card."""
    assert [(i.type, i.model_extra.get("mlflow")) for i in job.integrations if i.type == "mlflow"] == [
        ("mlflow", {"experiment_name": "models-test"})]
    api = "/api/2.0/mlflow"
    async with httpx.AsyncClient(base_url=tracking, timeout=60) as http:
        async def finished_runs() -> list[dict]:
            found = await http.get(f"{api}/experiments/get-by-name", params={"experiment_name": "demo/models-test"})
            if found.status_code != 200:
                return []
            runs = (await http.post(f"{api}/runs/search", json={
                "experiment_ids": [found.json()["experiment"]["experiment_id"]],
                "filter": f"tags.\"whetstone.job_id\" = '{job.id}'"})).json().get("runs", [])
            return runs if runs and runs[0]["info"]["status"] == "FINISHED" else []

        [run] = await until(finished_runs, bool, 180, "the job's MLflow run to finish")
        info, data = run["info"], run["data"]
        params = {p["key"]: p["value"] for p in data["params"]}
        tags = {t["key"]: t["value"] for t in data["tags"]}
        hp = job.method.supervised.hyperparameters
        assert (params["base_model"], params["method"], params["hp.n_epochs"], params["hp.lora_r"]) == (
            "tiny-llama", "lora", str(hp.n_epochs), str(hp.model_extra["lora_r"])), params
        assert (info["run_name"], tags["eval.verdict"], tags["whetstone.fine_tuned_model"]) == (
            job.id, "passed", job.fine_tuned_model), tags
        history = (await http.get(f"{api}/metrics/get-history", params={
            "run_id": info["run_id"], "metric_key": "train_loss"})).json()["metrics"]
        steps = [m["step"] for m in history]
        assert len(steps) >= 2 and len(steps) == len(set(steps)), history   # each step once
        assert all(m["value"] > 0 for m in history)
        root = info["artifact_uri"].removeprefix("mlflow-artifacts:/")
        card = await http.get(f"/api/2.0/mlflow-artifacts/artifacts/{root}/model_card/README.md")
        assert card.status_code == 200 and model_id in card.text, card.text[:500]


async def refused_for_too_few(client: openai.AsyncOpenAI, file_id: str, auto: dict) -> None:
    try:
        job = await client.fine_tuning.jobs.create(model="tiny-llama", training_file=file_id, method={
            "type": "supervised", "supervised": {"hyperparameters": auto}})
    except openai.BadRequestError as refused:
        error = refused.body
    else:
        job = await until(lambda: client.fine_tuning.jobs.retrieve(job.id), lambda j: j.status in TERMINAL, 120,
                          "the 5-example job's refusal")
        assert job.status == "failed", job
        error = job.error.model_dump()
    assert error["param"] == "hyperparameters.n_epochs" and "at least 10" in error["message"], error


async def reproduce_with_cli(client: openai.AsyncOpenAI, job_id: str, monkeypatch) -> str:
    """`whet jobs reproduce JOB` against the gateway; the new job's id (its last line)."""
    from whetstone.cli.main import main

    monkeypatch.setenv("WHETSTONE_BASE_URL", str(client.base_url).rstrip("/"))
    monkeypatch.setenv("WHETSTONE_API_KEY", client.api_key)
    out = io.StringIO()

    def whet() -> int:
        with contextlib.redirect_stdout(out):
            return main(["jobs", "reproduce", job_id])

    assert await asyncio.to_thread(whet) == 0, out.getvalue()
    return out.getvalue().strip().splitlines()[-1]


async def answered(client: openai.AsyncOpenAI, model: str):
    try:
        return await client.chat.completions.create(model=model, messages=HELLO, max_tokens=4, temperature=0)
    except openai.NotFoundError:   # the serving projection follows the registry's events
        return None
