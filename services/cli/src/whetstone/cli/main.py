"""`whet`: the operator and developer command line.

  whet stack up                 embedded Kafka + Postgres + S3 until Ctrl-C
  whet dev                      all services + the public gateway (WHETSTONE_API_PORT, 8000) in one process
  whet keys create TENANT       an API key (last line; shown once), `whet keys list|revoke`
  whet models create-tiny NAME  a tiny random Llama + tokenizer in the local model catalog
  whet datasets upload FILE     put a dataset in S3 and publish dataset.submitted
  whet datasets check FILE      validate a dataset offline
  whet files|jobs|models|usage  the public API (WHETSTONE_API_KEY, WHETSTONE_BASE_URL; --json)
  whet graders validate|run    try a reinforcement grader (JSON file) before a job spends GPU time on it
                                failures: one line on stderr and an exit code (errors.py), no traceback
  whet jobs trace JOB           a job's events across topics and services: lag, handler latency (operators)
  whet demo                     everything above, end to end; in a terminal, the console on its data until Ctrl-C
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from . import dlq, keys, public, trace
from .errors import guarded_main


# ------------------------------------------------------------------ stack


def cmd_stack_up(args: argparse.Namespace) -> int:
    from whetstone.contracts import all_topic_partitions  # noqa: PLC0415

    from whetstone.runtime.settings import CommonSettings  # noqa: PLC0415
    from whetstone.devstack.stack_up import stack_up_main  # noqa: PLC0415

    s = CommonSettings()
    data_dir = Path(args.data_dir or s.data_dir)
    env_file = data_dir / "stack.env"
    if env_file.exists():  # a previous launcher's endpoints: never adopt them as "external" servers
        env_file.unlink()
    external = {"kafka_bootstrap": s.kafka_bootstrap, "database_url": s.database_url, "s3_endpoint": s.s3_endpoint,
                "s3_access_key": s.s3_access_key, "s3_secret_key": s.s3_secret_key}
    return stack_up_main(data_dir / "stack", all_topic_partitions(), [s.bucket], env_file,
                         broker_storage=args.broker_storage, **external)


def cmd_dev(args: argparse.Namespace) -> int:
    from .dev import run_platform  # noqa: PLC0415

    from whetstone.runtime.settings import CommonSettings  # noqa: PLC0415

    data_dir = CommonSettings().data_dir
    written: list[Path] = []

    def ready(upstreams: dict[str, str], gateway) -> None:
        written.append(trace.write_services_file(data_dir, upstreams))  # for `whet jobs trace`
        print("services: " + "  ".join(f"{k}={v}" for k, v in upstreams.items()), flush=True)
        print(f"public API: {gateway.url}/v1  (create a key: whet keys create demo)", flush=True)
        print(f"console: {gateway.url}/  (sign in with an API key)", flush=True)

    try:
        asyncio.run(run_platform(api_port=args.api_port, ready=ready))
    finally:
        for path in written:
            path.unlink(missing_ok=True)
    return 0


# ----------------------------------------------------------------- models


def cmd_models_create_tiny(args: argparse.Namespace) -> int:
    import os  # noqa: PLC0415

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")   # one line of output, not a shard-writing bar
    from whetstone.modelkit.tiny import build_tiny_model  # noqa: PLC0415
    from whetstone.modelkit.tiny_vision import build_tiny_vision_model  # noqa: PLC0415

    from whetstone.runtime.models import resolve_model  # noqa: PLC0415
    from whetstone.runtime.settings import CommonSettings  # noqa: PLC0415

    catalog = CommonSettings().model_catalog
    args.name = args.name or ("tiny-llava" if args.vision else "tiny-llama")
    build = build_tiny_vision_model if args.vision else build_tiny_model
    out = build(catalog / args.name, seed=args.seed)
    print(f"{args.name}: {out} sha256={resolve_model(args.name, catalog).sha256}")
    return 0


# --------------------------------------------------------------- datasets


def upload_dataset(store, path: Path, tenant_id: str) -> tuple[str, str, int]:
    """Stream the file to S3 under the tenant's upload prefix; returns (dataset_id, uri, size)."""
    from whetstone.contracts import dataset_id_for  # noqa: PLC0415

    from whetstone.runtime.s3 import sha256_file, tenant_prefix  # noqa: PLC0415

    digest = sha256_file(path)
    key = f"{tenant_prefix(tenant_id)}uploads/{digest}{path.suffix}"
    uri = store.put_file(key, path)
    return dataset_id_for(digest), uri, path.stat().st_size


async def submit_dataset(settings, path: Path, tenant_id: str, purpose: str = "sft", name: str | None = None) -> str:
    from whetstone.contracts import DatasetSubmittedV1  # noqa: PLC0415

    from whetstone.runtime.messaging import publish_direct  # noqa: PLC0415
    from whetstone.runtime.s3 import ObjectStore  # noqa: PLC0415

    store = ObjectStore(settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key, settings.bucket)
    dataset_id, uri, size = await asyncio.to_thread(upload_dataset, store, path, tenant_id)
    await publish_direct(settings.kafka_bootstrap, DatasetSubmittedV1(
        dataset_id=dataset_id, name=name or path.name, source_uri=uri, purpose=purpose, size_bytes=size),
        tenant_id=tenant_id)
    return dataset_id


def cmd_datasets_upload(args: argparse.Namespace) -> int:
    from whetstone.runtime.settings import resolve_settings  # noqa: PLC0415

    path = Path(args.file)
    if not path.is_file():
        print(f"no such file: {path}", file=sys.stderr)
        return 2
    dataset_id = asyncio.run(submit_dataset(resolve_settings(), path, args.tenant, args.purpose))
    print(dataset_id)
    return 0


def cmd_datasets_check(argv: list[str]) -> int:
    """`whet datasets check FILE ...`: the ingest service's own offline validator."""
    from whetstone.ingest.entrypoints.cli import check_main  # noqa: PLC0415

    return check_main(argv)


# ------------------------------------------------------------------- demo


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo  # noqa: PLC0415

    return run_demo(Path(args.dataset), keep=args.keep, console=args.console)


EPILOG = """\
first steps (see the README's "Interactive use"):
  whet stack up &                      # terminal 1: Kafka + PostgreSQL + S3
  whet models create-tiny              # the default base model, tiny-llama
  whet dev &                           # terminal 2: every service + the public API on :8000
  export WHETSTONE_API_KEY=$(whet keys create demo --scope read --scope write --scope models:promote | tail -1)
  whet files upload examples/datasets/chat_demo.jsonl --wait
  whet jobs create --training-file ds-... --follow

exit codes: 0 done, 1 the API refused or the job failed (the reason on stderr), 2 bad arguments or a missing
file, 3 the API (or a service) could not be reached, 130 interrupted."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="whet", description="Whetstone: fine-tune, evaluate and serve LoRA adapters.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    stack = sub.add_parser("stack", help="the embedded Kafka + PostgreSQL + S3 (development)",
                           description="The embedded servers every service needs, on 127.0.0.1.")
    stack = stack.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = stack.add_parser("up", help="start the embedded Kafka + Postgres + S3 until Ctrl-C; writes "
                                     "<data dir>/stack.env, which every other command reads")
    up.add_argument("--data-dir", help="where the servers keep their data (default WHETSTONE_DATA_DIR, .whetstone)")
    up.add_argument("--broker-storage", choices=("s3", "memory"), default="s3",
                    help="s3 (default): the broker keeps its log in the embedded S3 and survives a restart;"
                         " memory: faster, everything is lost when the broker stops")
    up.set_defaults(fn=cmd_stack_up)
    dev = sub.add_parser("dev", help="run all services and the public API (gateway) in one process until Ctrl-C",
                         description="All services and the public gateway in one process, on the stack that "
                                     "`whet stack up` started.")
    dev.add_argument("--api-port", type=int, help="public port (default WHETSTONE_API_PORT or 8000)")
    dev.set_defaults(fn=cmd_dev)
    keys.add_parser(sub)
    dlq.add_parser(sub)
    public.add_parsers(sub)
    jobs = next(a for a in sub.choices["jobs"]._actions if isinstance(a, argparse._SubParsersAction))
    trace.add_parser(jobs)
    models = next(a for a in sub.choices["models"]._actions if isinstance(a, argparse._SubParsersAction))
    tiny = models.add_parser("create-tiny", help="build a tiny random Llama + tokenizer into the local model catalog "
                                                 "(the default base model, tiny-llama; nothing is downloaded)")
    tiny.add_argument("name", nargs="?", help="catalog name (default tiny-llama, or tiny-llava with --vision)")
    tiny.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    tiny.add_argument("--vision", action="store_true", help="a tiny random LLaVA (CLIP vision tower, 32 x 32 "
                      "images) with its image processor: a base that can be trained on images")
    tiny.set_defaults(fn=cmd_models_create_tiny)
    ds = sub.add_parser("datasets", help="datasets without the public API: offline check, direct upload (operators)",
                        description="`check` validates a file offline exactly as ingest would; `upload` puts it in S3 "
                                    "and publishes dataset.submitted (needs the stack, no API key).")
    ds = ds.add_subparsers(dest="action", required=True, metavar="ACTION")
    upl = ds.add_parser("upload", help="stream a dataset to S3 and publish dataset.submitted; prints the dataset id")
    upl.add_argument("file")
    upl.add_argument("--tenant", default="demo", help="the tenant that owns it (default demo)")
    upl.add_argument("--purpose", default="sft", choices=["sft", "dpo", "cpt", "eval"],
                     help="what the rows are for (default sft)")
    upl.set_defaults(fn=cmd_datasets_upload)
    ds.add_parser("check", help="validate a dataset offline (whet datasets check --help)", add_help=False)
    from whetstone.eval.entrypoints.cli import add_subcommands as add_eval_subcommands  # noqa: PLC0415

    add_eval_subcommands(sub.add_parser("eval", help="eval gate tools (import-tasks)")
                         .add_subparsers(dest="action", required=True))
    demo = sub.add_parser("demo", help="the whole platform end to end on a fresh embedded stack, then shut down "
                                       "(in a terminal, once Ctrl-C ends the console on its data) (make demo)")
    demo.add_argument("--dataset", default="examples/datasets/chat_demo.jsonl", help="training file (JSONL)")
    demo.add_argument("--keep", action="store_true", help="keep the data directory")
    demo.add_argument("--console", action=argparse.BooleanOptionalAction, default=None,
                      help="keep the platform up for the web console after the walkthrough, until Ctrl-C "
                           "(default: when run in a terminal)")
    demo.set_defaults(fn=cmd_demo)
    return p


def _run(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["datasets", "check"]:  # its own parser lives in the ingest service
        return cmd_datasets_check(argv[2:])
    args = build_parser().parse_args(argv)
    return args.fn(args)


def main(argv: list[str] | None = None) -> int:
    """`whet`: every failure a user can meet ends in one line on stderr and an exit code, never a traceback."""
    return guarded_main(_run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
