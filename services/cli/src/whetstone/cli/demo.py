"""`make demo`: the whole platform on the embedded stack, one fine-tune end to end, driven the way a
user drives it: an API key, then the public API on one port (upload -> job -> follow -> model ->
usage) through the same code as `whet files|jobs|models|usage`."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api_objects import JobUsage
    from .client import Api

SERVICES = ("ingest", "scheduler", "trainer_agent", "eval", "registry", "metering", "serving")
DEMO_HYPERPARAMETERS = {"n_epochs": 2, "learning_rate": 2e-3, "batch_size": 8, "max_seq_len": 256,
                        "checkpoint_every_steps": 20, "lora_r": 8}


def run_demo(dataset: Path, *, keep: bool = False, tenant: str = "demo") -> int:
    from whetstone.contracts import all_topic_partitions  # noqa: PLC0415
    from whetstone.devstack.stack import EmbeddedStack  # noqa: PLC0415

    if not dataset.is_file():
        print(f"no such dataset: {dataset}")
        return 2
    began = time.monotonic()
    data_dir = Path(".whetstone") / f"demo-{int(time.time())}"
    stack = EmbeddedStack(data_dir / "stack", topics=all_topic_partitions(), buckets=["whetstone"],
                          log=lambda m: print(f"[stack] {m}"))
    try:
        endpoints = stack.start()
        os.environ.update(endpoints.as_env())
        os.environ["WHETSTONE_DATA_DIR"] = str(data_dir)
        os.environ.setdefault("WHETSTONE_LOG_LEVEL", "WARNING")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
        for svc in SERVICES:  # free ports: never collide with a `whet dev` already running
            os.environ[f"WHETSTONE_{svc.upper()}_HTTP_PORT"] = "0"
        print(f"[stack] kafka={endpoints.kafka_bootstrap} s3={endpoints.s3_endpoint} postgres=ready")
        code = asyncio.run(_demo(dataset, tenant))
    finally:
        stack.stop()
        if not keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    print(f"\ndemo finished in {time.monotonic() - began:.0f}s; everything shut down")
    return code


async def _demo(dataset: Path, tenant: str) -> int:
    from whetstone.modelkit.tiny import build_tiny_model  # noqa: PLC0415
    from whetstone.runtime.settings import resolve_settings  # noqa: PLC0415

    from .dev import run_platform  # noqa: PLC0415

    settings = resolve_settings()
    model_dir = await asyncio.to_thread(build_tiny_model, settings.model_catalog / "tiny-llama")
    print(f"[model] tiny random Llama + BPE tokenizer at {model_dir}")
    stop = asyncio.Event()
    ready: dict[str, Any] = {}
    platform = asyncio.create_task(run_platform(settings, api_port=0, stop=stop,
                                                ready=lambda up, gw: ready.update(upstreams=up, gateway=gw)))
    try:
        while not ready:
            if platform.done():
                platform.result()
                return 1
            await asyncio.sleep(0.1)
        print("[services] " + "  ".join(f"{k}:{v.rsplit(':', 1)[1]}" for k, v in ready["upstreams"].items()))
        print(f"[api] public API on {ready['gateway'].url}/v1")
        # the user's side runs in a thread, with the CLI's own (blocking) client
        return await asyncio.to_thread(user_session, ready["gateway"].url, ready["upstreams"]["scheduler"], dataset,
                                       tenant)
    finally:
        stop.set()
        await platform


def user_session(api_url: str, scheduler_url: str, dataset: Path, tenant: str) -> int:
    from .api_objects import ApiFile, ApiKey, Checkpoint, Job, JobEvent, Page, RegistryModel  # noqa: PLC0415
    from .client import Api, poll_until  # noqa: PLC0415
    from .keys import create_key  # noqa: PLC0415
    from .public import describe_file, describe_job, follow_job, usage_text, wait_for_file  # noqa: PLC0415

    key = ApiKey.from_api(create_key(tenant, name="demo", scopes=["read", "write", "models:promote"],
                                     base_url=scheduler_url))
    print(f"[key] {key.id} for tenant {key.tenant_id} (scopes {','.join(key.scopes)}): "
          f"{(key.key or '')[:16]}… shown once, stored only as a hash")
    with Api(f"{api_url}/v1", key.key) as api:
        uploaded = ApiFile.from_api(api.upload(dataset))
        print(f"[file] POST /v1/files {dataset} -> {uploaded.id} ({uploaded.bytes} bytes, status {uploaded.status})")
        checked, _ = wait_for_file(api, uploaded.id)
        print("[file] " + describe_file(checked).replace("\n", "\n       "))
        if checked.status != "processed":
            return 1
        body = {"model": "tiny-llama", "training_file": checked.id, "suffix": "demo",
                "method": {"type": "supervised", "whetstone": {"method": "lora"},
                           "supervised": {"hyperparameters": DEMO_HYPERPARAMETERS}}}
        created = Job.from_api(api.post("/fine_tuning/jobs", body, headers={"Idempotency-Key": f"demo-{checked.id}"}))
        print(f"[job] POST /v1/fine_tuning/jobs -> {created.id} ({created.status})")
        job, _ = follow_job(api, created.id)
        print("\n[job] " + describe_job(job).replace("\n", "\n      "))
        events = Page[JobEvent].from_api(api.events(job.id, limit=5)).data or []
        print("[events] newest: " + " | ".join(e.message for e in events))
        checkpoints = Page[Checkpoint].from_api(api.get(f"/fine_tuning/jobs/{job.id}/checkpoints")).data or []
        if checkpoints:
            print("[checkpoints] " + ", ".join(f"step {c.step_number}" for c in checkpoints))
        if job.status == "succeeded":
            model = poll_until(lambda: (Page[RegistryModel].from_api(api.get("/models", job_id=job.id)).data
                                        or [None])[0], "model")
            try:  # the job learns its model's name once the registry announced it
                job = poll_until(lambda: (lambda j: j if j.fine_tuned_model else None)(
                    Job.from_api(api.get(f"/fine_tuning/jobs/{job.id}"))), "fine_tuned_model", timeout_s=30)
            except TimeoutError:
                pass
            print(f"[model] {model.id}  name={model.name}  stage={model.stage}"
                  f"  fine_tuned_model={job.fine_tuned_model}")
            lin = model.lineage
            if lin:
                print(f"[lineage] base={lin.base_model}@sha256:{str(lin.base_model_sha256)[:16]}…  "
                      f"dataset={lin.dataset_id}@{str(lin.dataset_version)[:16]}…  "
                      f"method={lin.method}")
        usage = poll_until(lambda: _usage(api, job.id), "usage")
        print(f"[usage] {usage_text(usage)}")
    return 0 if job.status == "succeeded" else 1


def _usage(api: Api, job_id: str) -> JobUsage | None:
    """The job's usage once metering closed it (its total is written)."""
    from .api_objects import JobUsage  # noqa: PLC0415
    from .client import ApiFailure  # noqa: PLC0415

    try:
        u = JobUsage.from_api(api.get(f"/usage/jobs/{job_id}"))
    except ApiFailure as exc:
        if exc.status == 404:
            return None
        raise
    return u if u.total else None
