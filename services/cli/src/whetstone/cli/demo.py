"""`make demo`: the whole platform on the embedded stack, one fine-tune end to end, driven the way a
user drives it: an API key, then the public API on one port (upload -> job -> follow -> model ->
usage) through the same code as `whet files|jobs|models|usage`.

The terminal shows only the platform's own lines: everything the services and the libraries they run
write to stdout or stderr (structured logs, lm-eval's progress bars, bitsandbytes' and DeepSpeed's
warnings) goes to the services' log file instead (the process's fds 1 and 2 point at it); the demo's
own lines (`say`) and the job's progress are written to the terminal's original streams. In a terminal (or with --console) the platform then stays up on
the demo's data until Ctrl-C, and the demo ends with the command that opens the console on it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from whetstone.gateway.server import RunningGateway

    from .api_objects import JobUsage
    from .client import Api

SERVICES = ("ingest", "scheduler", "trainer_agent", "eval", "registry", "metering", "serving")
QUESTION = "What is 3 + 4?"   # asked of the demo's model once it is served


@dataclass(frozen=True)
class DemoRun:
    code: int                  # the process's exit code
    job_id: str | None = None
    key: str | None = None     # the demo's API key (the console signs in with it)


_terminal: IO[str] | None = None   # the terminal's stdout while library output goes to the log


def say(line: str) -> None:
    """One of the demo's own lines, on the terminal (never in the services' log)."""
    print(line, file=_terminal or sys.stdout, flush=True)


@contextlib.contextmanager
def library_output_to(log_path: Path) -> Iterator[IO[str]]:
    """fds 1 and 2 (stdout and stderr of the services and libraries, C code too) into `log_path`; `say`
    writes to the terminal's stdout, and the terminal's stderr is yielded for the job's progress.
    Restored on exit."""
    global _terminal
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    out, err = (os.fdopen(os.dup(fd), "w", buffering=1) for fd in saved)
    with open(log_path, "ab", buffering=0) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        _terminal = out
        try:
            yield err
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            _terminal = None
            for fd, original in zip((1, 2), saved, strict=True):
                os.dup2(original, fd)
                os.close(original)
            out.close()
            err.close()


def run_demo(dataset: Path, *, keep: bool = False, tenant: str = "demo", console: bool | None = None) -> int:
    """`console`: keep the platform up for the console after the walkthrough (None: when in a terminal)."""
    from whetstone.contracts import all_topic_partitions  # noqa: PLC0415
    from whetstone.devstack.stack import EmbeddedStack  # noqa: PLC0415

    if not dataset.is_file():
        say(f"no such dataset: {dataset}")
        return 2
    if console is None:
        console = sys.stdin.isatty() and sys.stdout.isatty()
    began = time.monotonic()
    data_dir = Path(".whetstone") / f"demo-{int(time.time())}"
    log_path = data_dir.with_name(f"{data_dir.name}.log")   # beside the data: kept when the data goes
    stack = EmbeddedStack(data_dir / "stack", topics=all_topic_partitions(), buckets=["whetstone"],
                          log=lambda m: say(f"[stack] {m}"))
    say(f"[logs] services and libraries: {log_path}")
    run = DemoRun(1)
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
        say(f"[stack] kafka={endpoints.kafka_bootstrap} s3={endpoints.s3_endpoint} postgres=ready")
        with library_output_to(log_path) as terminal:
            run = asyncio.run(_demo(dataset, tenant, terminal, data_dir if console else None, began))
    finally:
        stack.stop()
        if not keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    if run.code:
        say(f"\ndemo failed after {time.monotonic() - began:.0f}s; the services' log: {log_path}")
    elif console:
        say("\nthe console and the platform shut down")
    else:
        say(f"\ndemo finished in {time.monotonic() - began:.0f}s; everything shut down")
        say("[console] to browse the demo's data in the web console, run it in a terminal; the platform then "
            "stays up and the demo ends with the command that opens the console:")
        say("whet demo --console")
    return run.code


@dataclass(frozen=True)
class _Started:
    """What the platform reports once every service answers."""
    upstreams: dict[str, str]       # service -> its URL
    gateway: RunningGateway


async def _demo(dataset: Path, tenant: str, terminal: IO[str], console_dir: Path | None, began: float) -> DemoRun:
    from whetstone.modelkit.tiny import build_tiny_model  # noqa: PLC0415
    from whetstone.runtime.settings import resolve_settings  # noqa: PLC0415

    from .dev import run_platform  # noqa: PLC0415

    settings = resolve_settings()
    model_dir = await asyncio.to_thread(build_tiny_model, settings.model_catalog / "tiny-llama")
    say(f"[model] tiny random Llama + BPE tokenizer at {model_dir}")
    stop = asyncio.Event()
    ready: list[_Started] = []
    platform = asyncio.create_task(run_platform(settings, api_port=0, stop=stop,
                                                ready=lambda up, gw: ready.append(_Started(up, gw))))
    try:
        while not ready:
            if platform.done():
                platform.result()
                return DemoRun(1)
            await asyncio.sleep(0.1)
        started = ready[0]
        say("[services] " + "  ".join(f"{k}:{v.rsplit(':', 1)[1]}" for k, v in started.upstreams.items()))
        url = started.gateway.url
        say(f"[api] public API on {url}/v1")
        # the user's side runs in a thread, with the CLI's own (blocking) client
        run = await asyncio.to_thread(user_session, url, started.upstreams["scheduler"], dataset, tenant, terminal)
        if console_dir is not None and run.code == 0 and run.key:
            await serve_console(url, console_dir, run, began)
        return run
    finally:
        stop.set()
        await platform


async def serve_console(url: str, data_dir: Path, run: DemoRun, began: float) -> None:
    """Keep the platform up on the demo's data until Ctrl-C (or SIGTERM); the last line printed is the
    command that opens the console on the demo's job. The key is handed over in a file only we can read."""
    key_file = data_dir / "console.key"
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{run.key}\n")
    say(f"\n[demo] walkthrough finished in {time.monotonic() - began:.0f}s; the platform stays up on its data "
        "until Ctrl-C")
    say(f"[console] {url}/ : sign in with the demo's API key, in {key_file}")
    say(f"python3 -m webbrowser '{url}/#/jobs/{run.job_id}'")
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, done.set)
    try:
        await done.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def user_session(api_url: str, scheduler_url: str, dataset: Path, tenant: str, terminal: IO[str] | None = None
                 ) -> DemoRun:
    from .api_objects import ApiFile, ApiKey, Checkpoint, Job, JobEvent, Page, RegistryModel  # noqa: PLC0415
    from .client import Api, poll_until  # noqa: PLC0415
    from .keys import create_key  # noqa: PLC0415
    from .follow import follow  # noqa: PLC0415
    from .public import describe_file, describe_job, usage_text, wait_for_file  # noqa: PLC0415

    key = ApiKey.from_api(create_key(tenant, name="demo", scopes=["read", "write", "models:promote"],
                                     base_url=scheduler_url))
    say(f"[key] {key.id} for tenant {key.tenant_id} (scopes {','.join(key.scopes)}): "
        f"{(key.key or '')[:16]}… shown once, stored only as a hash")
    with Api(f"{api_url}/v1", key.key) as api:
        uploaded = ApiFile.from_api(api.upload(dataset))
        say(f"[file] POST /v1/files {dataset} -> {uploaded.id} ({uploaded.bytes} bytes, status {uploaded.status})")
        checked, _ = wait_for_file(api, uploaded.id)
        say("[file] " + describe_file(checked).replace("\n", "\n       "))
        if checked.status != "processed":
            return DemoRun(1)
        # the README's first job: no hyperparameters, every one "auto" (resolved from the data and the base)
        body = {"model": "tiny-llama", "training_file": checked.id, "suffix": "demo",
                "method": {"type": "supervised", "whetstone": {"method": "lora"}}}
        created = Job.from_api(api.post("/fine_tuning/jobs", body, headers={"Idempotency-Key": f"demo-{checked.id}"}))
        say(f"[job] POST /v1/fine_tuning/jobs -> {created.id} ({created.status})")
        job, _ = follow(api, created.id, stream=terminal)   # progress on the terminal, not the services' log
        say("\n[job] " + describe_job(job).replace("\n", "\n      "))
        events = Page[JobEvent].from_api(api.events(job.id, limit=5)).data or []
        say("[events] newest: " + " | ".join(e.message for e in events))
        checkpoints = Page[Checkpoint].from_api(api.get(f"/fine_tuning/jobs/{job.id}/checkpoints")).data or []
        if checkpoints:
            say("[checkpoints] " + ", ".join(f"step {c.step_number}" for c in checkpoints))
        if job.status == "succeeded":
            model = poll_until(lambda: (Page[RegistryModel].from_api(api.get("/models", job_id=job.id)).data
                                        or [None])[0], "model")
            try:  # the job learns its model's name once the registry announced it
                job = poll_until(lambda: (lambda j: j if j.fine_tuned_model else None)(
                    Job.from_api(api.get(f"/fine_tuning/jobs/{job.id}"))), "fine_tuned_model", timeout_s=30)
            except TimeoutError:
                pass
            say(f"[model] {model.id}  name={model.name}  stage={model.stage}"
                f"  fine_tuned_model={job.fine_tuned_model}")
            lin = model.lineage
            if lin:
                say(f"[lineage] base={lin.base_model}@sha256:{str(lin.base_model_sha256)[:16]}…  "
                    f"dataset={lin.dataset_id}@{str(lin.dataset_version)[:16]}…  "
                    f"method={lin.method}")
            if model.stage in ("staging", "production"):
                say(f"[chat] POST /v1/chat/completions model={job.fine_tuned_model or model.id} {QUESTION!r} -> "
                    f"{_answer(api, job.fine_tuned_model or model.id)!r}")
        usage = poll_until(lambda: _usage(api, job.id), "usage")
        say(f"[usage] {usage_text(usage)}")
    return DemoRun(0 if job.status == "succeeded" else 1, job.id, key.key)


def _answer(api: Api, model: str) -> str:
    """The served model's answer to QUESTION (serving loads the model once the registry announced it)."""
    from openai.types.chat import ChatCompletion  # noqa: PLC0415

    from .client import ApiFailure, poll_until  # noqa: PLC0415

    def ask() -> str | None:
        try:
            answer = api.post("/chat/completions", {"model": model, "max_tokens": 16, "temperature": 0,
                                                    "messages": [{"role": "user", "content": QUESTION}]})
        except ApiFailure as exc:
            if exc.status == 404:
                return None
            raise
        return str(ChatCompletion.model_validate(answer).choices[0].message.content) or "(an empty answer)"

    return str(poll_until(ask, f"an answer from {model}", timeout_s=60))


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
