"""`whet files|jobs|models|usage`: the public API from the command line (WHETSTONE_API_KEY,
WHETSTONE_BASE_URL). `--json` prints the API's objects for scripts; the id a command creates is
always on its last line."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .client import Api, ApiFailure, dumps, poll_until
from .follow import TERMINAL, LossCurve, all_events, follow


def _when(ts: Any) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S") if isinstance(ts, (int, float)) else "-"


def _out(args: argparse.Namespace, obj: Any, text: str) -> None:
    print(dumps(obj) if args.json else text)


# ------------------------------------------------------------------ files


def file_line(f: dict) -> str:
    return (f"{f['id']}  {f['status']:<9} {f.get('bytes', 0):>10}B  {f.get('purpose')}/{f.get('dataset_purpose', '-')}"
            f"  {f.get('filename')}  {_when(f.get('created_at'))}")


def wait_for_file(api: Api, file_id: str, timeout_s: float = 600) -> dict:
    """The file once validated (status no longer `uploaded`)."""
    def validated() -> dict | None:
        f = api.get(f"/files/{file_id}")
        return f if f["status"] != "uploaded" else None

    return poll_until(validated, f"validation of file {file_id}", timeout_s=timeout_s)


def describe_file(f: dict) -> str:
    lines = [file_line(f)]
    v = f.get("validation")
    if v:
        lines.append(f"  validation: {v['status']}  rows {v.get('rows_kept')}/{v.get('rows_total')}  "
                     f"format={v.get('format')} schema={v.get('schema')} tokens={v.get('tokens_total')}")
        for e in (v.get("errors") or [])[:20]:
            where = f"line {e['line']}: " if e.get("line") else ""
            lines.append(f"  error   {where}{e.get('message')} [{e.get('code')}]")
        for w in (v.get("warnings") or [])[:5]:
            lines.append(f"  warning {w.get('message')} [{w.get('code')}]")
    return "\n".join(lines)


def cmd_files(args: argparse.Namespace) -> int:
    with Api() as api:
        if args.action == "upload":
            path = Path(args.file)
            if not path.is_file():
                print(f"no such file: {path}", file=sys.stderr)
                return 2
            f = api.upload(path, args.purpose)
            if args.wait:
                f = wait_for_file(api, f["id"])
            _out(args, f, describe_file(f))
            if not args.json:
                print(f["id"])
            return 1 if f["status"] == "error" else 0
        if args.action == "list":
            files = list(api.pages("/files", limit=args.limit)) if args.all else api.get("/files", limit=args.limit)["data"]
            _out(args, files, "\n".join(file_line(f) for f in files) or "no files")
            return 0
        f = api.get(f"/files/{args.file_id}")
        _out(args, f, describe_file(f))
        return 0


# ------------------------------------------------------------------- jobs

PLATFORM_METHODS = {"lora": "supervised", "qlora": "supervised", "full": "supervised", "cpt": "supervised",
                    "dpo": "dpo", "orpo": "dpo"}


def job_body(args: argparse.Namespace) -> dict[str, Any]:
    """OpenAI's create body: `method` as an object, the platform method as its `whetstone` extension."""
    hp: dict[str, Any] = {k: v for k, v in {"n_epochs": args.epochs, "learning_rate": args.learning_rate,
                                            "batch_size": args.batch_size}.items() if v is not None}
    for item in args.hp or []:
        k, sep, v = item.partition("=")
        if not sep:
            raise SystemExit(f"--hp takes KEY=VALUE, not {item!r}")
        try:
            hp[k] = json.loads(v)
        except ValueError:
            hp[k] = v
    method = args.method
    family = {"supervised": "supervised", "dpo": "dpo"}.get(method) or PLATFORM_METHODS.get(method)
    if family is None:
        raise SystemExit(f"unknown method {method!r}: supervised, dpo, " + ", ".join(PLATFORM_METHODS))
    spec: dict[str, Any] = {"type": family}
    if method not in ("supervised", "dpo"):
        spec["whetstone"] = {"method": method}
    if hp:
        spec[family] = {"hyperparameters": hp}
    body: dict[str, Any] = {"model": args.model, "training_file": args.training_file, "method": spec}
    for name in ("validation_file", "suffix", "seed"):
        if getattr(args, name, None) is not None:
            body[name] = getattr(args, name)
    return body


def job_line(j: dict) -> str:
    p = j.get("progress") or {}
    step = f"step {p.get('step')}/{p.get('total_steps')}" if p.get("step") is not None else ""
    state = f"/{j['state']}" if j.get("state") and j.get("state") != j["status"] else ""
    return (f"{j['id']}  {j['status']}{state:<14} {j.get('model')}  file={j.get('training_file')}  {step}"
            f"  {_when(j.get('created_at'))}  {j.get('fine_tuned_model') or ''}").rstrip()


def describe_job(j: dict) -> str:
    lines = [job_line(j)]
    method = j.get("method")
    if isinstance(method, dict):
        lines.append(f"  method {method.get('type')} ({(method.get('whetstone') or {}).get('method', '-')})  "
                     f"hyperparameters {json.dumps(j.get('hyperparameters'))}")
    if j.get("error") and any((j.get("error") or {}).values()):
        lines.append(f"  error  {j['error'].get('code')}: {j['error'].get('message')}")
    ev = j.get("eval")
    if ev:
        lines.append(f"  eval   verdict={ev.get('verdict')}  " + "; ".join(ev.get("reasons") or []))
        for m in ev.get("metrics") or []:
            base = f"{m['base']:.4f}" if isinstance(m.get("base"), (int, float)) else "-"
            cand = f"{m['candidate']:.4f}" if isinstance(m.get("candidate"), (int, float)) else "-"
            lines.append(f"         {m.get('name', '?'):<20} base={base:<10} candidate={cand}")
    if j.get("trained_tokens") is not None:
        lines.append(f"  trained_tokens {j['trained_tokens']}")
    return "\n".join(lines)


def follow_job(api: Api, job_id: str, *, loss_png: str | None = None, quiet: bool = False) -> dict:
    curve = LossCurve()
    job = follow(api, job_id, quiet=quiet, curve=curve)
    if loss_png:
        curve.add_events(all_events(api, job_id))
        if curve.points:
            title = f"{job_id} ({job['status']})"
            print(f"loss curve: {curve.save_png(Path(loss_png), title)}", file=sys.stderr)
        else:
            print("loss curve: no loss reported yet", file=sys.stderr)
    return job


def cmd_jobs(args: argparse.Namespace) -> int:
    with Api() as api:
        if args.action == "create":
            headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
            job = api.post("/fine_tuning/jobs", job_body(args), headers=headers)
            if args.follow:
                job = follow_job(api, job["id"], loss_png=args.loss_png, quiet=args.json)
            _out(args, job, describe_job(job))
            if not args.json:
                print(job["id"])
            return 0 if job["status"] != "failed" else 1
        if args.action == "list":
            jobs = list(api.pages("/fine_tuning/jobs", limit=min(args.limit, 100))) if args.all \
                else api.get("/fine_tuning/jobs", limit=args.limit)["data"]
            _out(args, jobs, "\n".join(job_line(j) for j in jobs) or "no jobs")
            return 0
        if args.action == "get":
            job = api.get(f"/fine_tuning/jobs/{args.job_id}")
            _out(args, job, describe_job(job))
            return 0
        if args.action == "cancel":
            job = api.post(f"/fine_tuning/jobs/{args.job_id}/cancel")
            _out(args, job, describe_job(job))
            return 0
        if args.action == "follow":
            job = follow_job(api, args.job_id, loss_png=args.loss_png, quiet=args.json)
            _out(args, job, describe_job(job))
            return 0 if job["status"] == "succeeded" else 1
        events = all_events(api, args.job_id) if args.all else \
            list(reversed(api.events(args.job_id, limit=args.limit)["data"]))
        _out(args, events, "\n".join(f"{_when(e.get('created_at'))}  {e.get('level', ''):<7} {e.get('message')}"
                                     for e in events) or "no events")
        return 0


# ---------------------------------------------------------------- models


def model_line(m: dict) -> str:
    return f"{m['id']}  stage={m.get('stage', '-'):<11} {m.get('name', '')}  job={m.get('job_id', '-')}"


def cmd_models(args: argparse.Namespace) -> int:
    with Api() as api:
        if args.action == "list":
            models = api.get("/models", job_id=args.job)["data"]
            _out(args, models, "\n".join(model_line(m) for m in models) or "no models")
        elif args.action == "get":
            m = api.get(f"/models/{args.model_id}")
            _out(args, m, model_line(m) + (f"\n  lineage {json.dumps(m['lineage'])}" if m.get("lineage") else ""))
        elif args.action == "promote":
            m = api.post(f"/models/{args.model_id}/promote", {"stage": args.stage, "reason": args.reason})
            _out(args, m, model_line(m))
        else:
            m = api.post(f"/models/{args.model_id}/rollback", {"reason": args.reason})
            _out(args, m, model_line(m))
    return 0


# ----------------------------------------------------------------- usage


def usage_text(u: dict) -> str:
    total = u.get("total") or {}
    return (f"{u.get('job_id')}  status={u.get('status')}  gpu_seconds={total.get('gpu_seconds', 0):.1f}  "
            f"billable={total.get('billable_gpu_seconds', 0):.1f}  cost=${total.get('cost', 0):.6f}  "
            f"class={total.get('charge_class')}  segments={len(u.get('lines') or [])}")


def cmd_usage(args: argparse.Namespace) -> int:
    with Api() as api:
        if args.job:
            u = api.get(f"/usage/jobs/{args.job}")
            _out(args, u, usage_text(u))
        else:
            month = args.month or datetime.now(UTC).strftime("%Y-%m")
            u = api.get("/usage", month=month)   # the key's own tenant
            _out(args, u, dumps(u))
    return 0


# ---------------------------------------------------------------- parsers


def guarded(fn):
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except ApiFailure as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return run


def add_parsers(sub) -> None:
    def cmd(parent, name: str, fn, help_: str | None = None):
        p = parent.add_parser(name, help=help_)
        p.add_argument("--json", action="store_true", help="print the API's JSON")
        p.set_defaults(fn=guarded(fn))
        return p

    files = sub.add_parser("files", help="training files (public API)").add_subparsers(dest="action", required=True)
    up = cmd(files, "upload", cmd_files, "upload a training file (streamed); its id on the last line")
    up.add_argument("file")
    up.add_argument("--purpose", default="fine-tune")
    up.add_argument("--wait", action="store_true", help="wait for the validation verdict")
    lst = cmd(files, "list", cmd_files)
    lst.add_argument("--limit", type=int, default=20)
    lst.add_argument("--all", action="store_true")
    cmd(files, "get", cmd_files).add_argument("file_id")

    jobs = sub.add_parser("jobs", help="fine-tuning jobs (public API)").add_subparsers(dest="action", required=True)
    cj = cmd(jobs, "create", cmd_jobs, "create a fine-tuning job; its id on the last line")
    cj.add_argument("--training-file", required=True)
    cj.add_argument("--validation-file")
    cj.add_argument("--model", default="tiny-llama")
    cj.add_argument("--method", default="supervised", help="supervised | dpo | lora | qlora | full | cpt | orpo")
    cj.add_argument("--epochs", type=int)
    cj.add_argument("--learning-rate", type=float)
    cj.add_argument("--batch-size", type=int)
    cj.add_argument("--hp", action="append", metavar="KEY=VALUE", help="any hyperparameter (JSON value), repeatable")
    cj.add_argument("--suffix")
    cj.add_argument("--seed", type=int)
    cj.add_argument("--idempotency-key", help="retries with the same key return the same job")
    cj.add_argument("--follow", action="store_true", help="live progress until the job ends")
    cj.add_argument("--loss-png", help="with --follow: write the loss curve to this PNG")
    jl = cmd(jobs, "list", cmd_jobs)
    jl.add_argument("--limit", type=int, default=20)
    jl.add_argument("--all", action="store_true")
    cmd(jobs, "get", cmd_jobs).add_argument("job_id")
    cmd(jobs, "cancel", cmd_jobs).add_argument("job_id")
    jf = cmd(jobs, "follow", cmd_jobs, "live progress bar (step, loss, ETA) until the job ends")
    jf.add_argument("job_id")
    jf.add_argument("--loss-png", help="write the loss curve to this PNG at the end")
    je = cmd(jobs, "events", cmd_jobs)
    je.add_argument("job_id")
    je.add_argument("--limit", type=int, default=50)
    je.add_argument("--all", action="store_true")

    models = sub.add_parser("models", help="models (public API) and the local base-model catalog")
    mods = models.add_subparsers(dest="action", required=True)
    cmd(mods, "list", cmd_models).add_argument("--job")
    cmd(mods, "get", cmd_models).add_argument("model_id")
    mp = cmd(mods, "promote", cmd_models)
    mp.add_argument("model_id")
    mp.add_argument("--stage", default="production")
    mp.add_argument("--reason", default="")
    mr = cmd(mods, "rollback", cmd_models)
    mr.add_argument("model_id")
    mr.add_argument("--reason", default="")

    us = cmd(sub, "usage", cmd_usage, "metered usage: one job (--job) or the key's tenant's month")
    us.add_argument("--job")
    us.add_argument("--month", help="YYYY-MM (default: this month)")


__all__ = ["TERMINAL", "add_parsers", "follow_job", "wait_for_file", "describe_job", "describe_file", "usage_text"]
