"""`whet`: the operator and developer command line.

  whet stack up                 embedded Kafka + Postgres + S3 until Ctrl-C
  whet dev                      all six services in one process
  whet models create-tiny NAME  a tiny random Llama + tokenizer in the local model catalog
  whet datasets upload FILE     put a dataset in S3 and publish dataset.submitted
  whet datasets check FILE      validate a dataset offline
  whet jobs create ...          submit a fine-tune and follow it
  whet demo                     everything above, end to end, then shut down
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_PORTS = {"scheduler": 8100, "ingest": 8101, "trainer-agent": 8102, "eval": 8103, "registry": 8104,
                 "metering": 8105}


def all_service_builders():
    from whetstone.eval.bootstrap import build_service as eval_svc  # noqa: PLC0415
    from whetstone.ingest.bootstrap import build_service as ingest_svc  # noqa: PLC0415
    from whetstone.metering.bootstrap import build_service as metering_svc  # noqa: PLC0415
    from whetstone.registry.bootstrap import build_service as registry_svc  # noqa: PLC0415
    from whetstone.scheduler.bootstrap import build_service as scheduler_svc  # noqa: PLC0415
    from whetstone.trainer_agent.bootstrap import build_service as trainer_svc  # noqa: PLC0415

    return [ingest_svc, scheduler_svc, trainer_svc, eval_svc, registry_svc, metering_svc]


# ------------------------------------------------------------------ stack


def cmd_stack_up(args: argparse.Namespace) -> int:
    from whetstone.contracts import all_topic_partitions  # noqa: PLC0415

    from .settings import CommonSettings  # noqa: PLC0415
    from .stack import stack_up_main  # noqa: PLC0415

    s = CommonSettings()
    data_dir = Path(args.data_dir or s.data_dir)
    env_file = data_dir / "stack.env"
    if env_file.exists():  # a previous launcher's endpoints: never adopt them as "external" servers
        env_file.unlink()
    external = {"kafka_bootstrap": s.kafka_bootstrap, "database_url": s.database_url, "s3_endpoint": s.s3_endpoint,
                "s3_access_key": s.s3_access_key, "s3_secret_key": s.s3_secret_key}
    return stack_up_main(data_dir / "stack", all_topic_partitions(), [s.bucket], env_file, **external)


def cmd_dev(args: argparse.Namespace) -> int:
    from .service import run_services  # noqa: PLC0415

    asyncio.run(run_services([b() for b in all_service_builders()]))
    return 0


# ----------------------------------------------------------------- models


def cmd_models_create_tiny(args: argparse.Namespace) -> int:
    from whetstone.modelkit.tiny import build_tiny_model  # noqa: PLC0415

    from .models import resolve_model  # noqa: PLC0415
    from .settings import CommonSettings  # noqa: PLC0415

    catalog = CommonSettings().model_catalog
    out = build_tiny_model(catalog / args.name, seed=args.seed)
    print(f"{args.name}: {out} sha256={resolve_model(args.name, catalog).sha256}")
    return 0


# --------------------------------------------------------------- datasets


def upload_dataset(store, path: Path, tenant_id: str) -> tuple[str, str, int]:
    """Stream the file to S3 under the tenant's upload prefix; returns (dataset_id, uri, size)."""
    from whetstone.contracts import dataset_id_for  # noqa: PLC0415

    from .s3 import sha256_file, tenant_prefix  # noqa: PLC0415

    digest = sha256_file(path)
    key = f"{tenant_prefix(tenant_id)}uploads/{digest}{path.suffix}"
    uri = store.put_file(key, path)
    return dataset_id_for(digest), uri, path.stat().st_size


async def submit_dataset(settings, path: Path, tenant_id: str, purpose: str = "sft", name: str | None = None) -> str:
    from whetstone.contracts import DatasetSubmittedV1  # noqa: PLC0415

    from .messaging import publish_direct  # noqa: PLC0415
    from .s3 import ObjectStore  # noqa: PLC0415

    store = ObjectStore(settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key, settings.bucket)
    dataset_id, uri, size = await asyncio.to_thread(upload_dataset, store, path, tenant_id)
    await publish_direct(settings.kafka_bootstrap, DatasetSubmittedV1(
        dataset_id=dataset_id, name=name or path.name, source_uri=uri, purpose=purpose, size_bytes=size),
        tenant_id=tenant_id)
    return dataset_id


def cmd_datasets_upload(args: argparse.Namespace) -> int:
    from .service import resolve_settings  # noqa: PLC0415

    path = Path(args.file)
    if not path.is_file():
        print(f"no such file: {path}", file=sys.stderr)
        return 2
    dataset_id = asyncio.run(submit_dataset(resolve_settings(), path, args.tenant, args.purpose))
    print(dataset_id)
    return 0


def cmd_datasets_check(argv: list[str]) -> int:
    """`whet datasets check FILE ...`: the ingest service's own offline validator."""
    from whetstone.ingest.cli import check_main  # noqa: PLC0415

    return check_main(argv)


# ------------------------------------------------------------------- jobs


async def follow_job(client, job_id: str, tenant_id: str, timeout_s: float = 600) -> dict:
    """Live progress bar (step, loss) until the job reaches a terminal state."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    headers = {"X-Tenant-Id": tenant_id}
    deadline = time.monotonic() + timeout_s
    with Progress(TextColumn("[bold]{task.fields[status]:<16}"), BarColumn(), TextColumn("step {task.completed}/{task.total}"),
                  TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), transient=False) as bar:
        task = bar.add_task("train", total=None, status="submitted", loss="-")
        while True:
            job = (await client.get(f"/v1/fine_tuning/jobs/{job_id}", headers=headers)).json()
            p = job.get("progress") or {}
            loss = f"{p['loss']:.4f}" if isinstance(p.get("loss"), (int, float)) else "-"
            bar.update(task, total=p.get("total_steps"), completed=p.get("step", 0), status=job["status"], loss=loss)
            if job["status"] in ("succeeded", "failed", "cancelled"):
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['status']} after {timeout_s}s")
            await asyncio.sleep(0.5)


async def wait_for(fetch, what: str, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        r = await fetch()
        if r.status_code == 200 and (r.json().get("data", True) and r.json().get("total", True)):
            return r.json()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not available after {timeout_s}s: {r.status_code} {r.text[:200]}")
        await asyncio.sleep(0.3)


async def create_and_follow(ports: dict[str, int], tenant_id: str, body: dict, key: str) -> dict:
    import httpx  # noqa: PLC0415

    base = "http://127.0.0.1:{}"
    headers = {"X-Tenant-Id": tenant_id, "Idempotency-Key": key}
    async with httpx.AsyncClient(base_url=base.format(ports["scheduler"]), timeout=30) as sched:
        r = await sched.post("/v1/fine_tuning/jobs", json=body, headers=headers)
        if r.status_code != 200:
            raise SystemExit(f"job rejected ({r.status_code}): {r.text}")
        job = await follow_job(sched, r.json()["id"], tenant_id)
    result: dict[str, Any] = {"job": job}
    h = {"X-Tenant-Id": tenant_id}
    if job["status"] == "succeeded":
        async with httpx.AsyncClient(base_url=base.format(ports["registry"]), timeout=30) as reg:
            models = await wait_for(lambda: reg.get("/v1/models", params={"job_id": job["id"]}, headers=h), "model")
            result["model"] = models["data"][0]
    async with httpx.AsyncClient(base_url=base.format(ports["metering"]), timeout=30) as met:
        result["usage"] = await wait_for(lambda: met.get(f"/v1/usage/jobs/{job['id']}", headers=h), "usage")
    return result


def print_summary(result: dict) -> None:
    job, model, usage = result["job"], result.get("model"), result["usage"]
    print(f"\njob       {job['id']}  status={job['status']}  trained_tokens={job['trained_tokens']}")
    if job.get("error"):
        print(f"error     {job['error']}")
    if job.get("eval"):
        ev = job["eval"]
        print(f"eval      verdict={ev['verdict']}  " + "; ".join(ev["reasons"]))
        for m in ev["metrics"]:
            base = f"{m['base']:.4f}" if m.get("base") is not None else "-"
            print(f"          {m['name']:<20} base={base:<10} candidate={m['candidate']:.4f}")
    if model:
        lin = model["lineage"]
        print(f"model     {model['id']}  name={model['name']}  stage={model['stage']}")
        print(f"lineage   base={lin['base_model']}@sha256:{lin['base_model_sha256'][:16]}…  "
              f"dataset={lin['dataset_id']}@{lin['dataset_version'][:16]}…  method={lin['method']}  "
              f"hparams={lin['hyperparameters_hash'][:16]}…")
        print(f"artifact  {model['artifact_uri']}  sha256={model['artifact_sha256'][:16]}…")
    total = usage.get("total") or {}
    print(f"usage     gpu_seconds={total.get('gpu_seconds', 0):.1f}  billable={total.get('billable_gpu_seconds', 0):.1f}"
          f"  cost=${total.get('cost', 0):.6f}  class={total.get('charge_class')}  segments={len(usage['lines'])}")


def cmd_jobs_create(args: argparse.Namespace) -> int:
    hp = {k: v for k, v in {"n_epochs": args.epochs, "learning_rate": args.learning_rate,
                            "batch_size": args.batch_size}.items() if v is not None}
    body = {"model": args.model, "training_file": args.training_file, "method": args.method, "hyperparameters": hp}
    key = args.idempotency_key or hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32]
    print_summary(asyncio.run(create_and_follow(DEFAULT_PORTS, args.tenant, body, key)))
    return 0


# ------------------------------------------------------------------- demo


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo  # noqa: PLC0415

    return run_demo(Path(args.dataset), keep=args.keep)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="whet", description="Whetstone fine-tuning platform")
    sub = p.add_subparsers(dest="cmd", required=True)
    stack = sub.add_parser("stack").add_subparsers(dest="action", required=True)
    up = stack.add_parser("up", help="start the embedded Kafka + Postgres + S3 until Ctrl-C")
    up.add_argument("--data-dir")
    up.set_defaults(fn=cmd_stack_up)
    sub.add_parser("dev", help="run all six services in one process").set_defaults(fn=cmd_dev)
    models = sub.add_parser("models").add_subparsers(dest="action", required=True)
    tiny = models.add_parser("create-tiny")
    tiny.add_argument("name", nargs="?", default="tiny-llama")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(fn=cmd_models_create_tiny)
    ds = sub.add_parser("datasets").add_subparsers(dest="action", required=True)
    upl = ds.add_parser("upload")
    upl.add_argument("file")
    upl.add_argument("--tenant", default="demo")
    upl.add_argument("--purpose", default="sft", choices=["sft", "dpo", "cpt", "eval"])
    upl.set_defaults(fn=cmd_datasets_upload)
    ds.add_parser("check", help="validate a dataset offline (whet datasets check --help)", add_help=False)
    jobs = sub.add_parser("jobs").add_subparsers(dest="action", required=True)
    cj = jobs.add_parser("create")
    cj.add_argument("--tenant", default="demo")
    cj.add_argument("--model", default="tiny-llama")
    cj.add_argument("--training-file", required=True)
    cj.add_argument("--method", default="lora")
    cj.add_argument("--epochs", type=int)
    cj.add_argument("--learning-rate", type=float)
    cj.add_argument("--batch-size", type=int)
    cj.add_argument("--idempotency-key")
    cj.set_defaults(fn=cmd_jobs_create)
    demo = sub.add_parser("demo", help="end-to-end demo on the embedded stack")
    demo.add_argument("--dataset", default="examples/datasets/chat_demo.jsonl")
    demo.add_argument("--keep", action="store_true", help="keep the data directory")
    demo.set_defaults(fn=cmd_demo)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["datasets", "check"]:  # its own parser lives in the ingest service
        return cmd_datasets_check(argv[2:])
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    raise SystemExit(main())
