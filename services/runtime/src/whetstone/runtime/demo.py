"""`make demo`: the whole platform on the embedded stack, one fine-tune end to end."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

SERVICES = ("ingest", "scheduler", "trainer_agent", "eval", "registry", "metering")
DEMO_HYPERPARAMETERS = {"n_epochs": 2, "learning_rate": 2e-3, "batch_size": 8, "max_seq_len": 256,
                        "checkpoint_every_steps": 20, "lora_r": 8}


def run_demo(dataset: Path, *, keep: bool = False, tenant: str = "demo") -> int:
    from whetstone.contracts import all_topic_partitions  # noqa: PLC0415

    from .stack import EmbeddedStack  # noqa: PLC0415

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
        asyncio.run(_demo(dataset, tenant))
    finally:
        stack.stop()
        if not keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    print(f"\ndemo finished in {time.monotonic() - began:.0f}s; everything shut down")
    return 0


async def _demo(dataset: Path, tenant: str) -> None:
    from whetstone.modelkit.tiny import build_tiny_model  # noqa: PLC0415

    from .cli import all_service_builders, create_and_follow, print_summary, submit_dataset  # noqa: PLC0415
    from .service import resolve_settings, run_services  # noqa: PLC0415

    settings = resolve_settings()
    model_dir = await asyncio.to_thread(build_tiny_model, settings.model_catalog / "tiny-llama")
    print(f"[model] tiny random Llama + BPE tokenizer at {model_dir}")
    stop = asyncio.Event()
    started: dict[str, int] = {}

    def ready(runtimes) -> None:
        started.update({rt.name: rt.http.port for rt in runtimes})

    services = asyncio.create_task(run_services([b() for b in all_service_builders()], settings, ready, stop))
    try:
        while not started:
            if services.done():
                services.result()
            await asyncio.sleep(0.1)
        print("[services] " + "  ".join(f"{k}:{v}" for k, v in started.items()))
        dataset_id = await submit_dataset(settings, dataset, tenant)
        print(f"[dataset] uploaded {dataset} as {dataset_id}; dataset.submitted published")
        body = {"model": "tiny-llama", "training_file": dataset_id, "method": "lora",
                "hyperparameters": DEMO_HYPERPARAMETERS}
        result = await create_and_follow(started, tenant, body, key=f"demo-{dataset_id}")
        print_summary(result)
    finally:
        stop.set()
        await services
