"""`whet jobs create|list|get|cancel|follow|events|checkpoints`: fine-tuning jobs over the public API."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .client import Api, ApiFailure, dumps
from .follow import LossCurve, all_events, follow

PLATFORM_METHODS = {"lora": "supervised", "qlora": "supervised", "full": "supervised", "cpt": "supervised",
                    "dpo": "dpo", "orpo": "dpo"}
DEFAULT_MODEL = "tiny-llama"


def _when(ts: Any) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S") if isinstance(ts, (int, float)) else "-"


def _out(args: argparse.Namespace, obj: Any, text: str) -> None:
    print(dumps(obj) if args.json else text)


def job_body(args: argparse.Namespace) -> dict[str, Any]:
    """OpenAI's create body: `method` as an object, the platform method as its `whetstone` extension."""
    hp: dict[str, Any] = {k: v for k, v in {"n_epochs": args.epochs, "learning_rate": args.learning_rate,
                                            "learning_rate_multiplier": getattr(args, "learning_rate_multiplier", None),
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


def step_text(progress: dict | None) -> str:
    """`step 12/40`, `step 12` while the total is unknown, '' before the first step."""
    p = progress or {}
    if not isinstance(p.get("step"), int):
        return ""
    return f"step {p['step']}/{p['total_steps']}" if p.get("total_steps") else f"step {p['step']}"


def job_line(j: dict, stage: str | None = None) -> str:
    """One job: status (and finer state), model, file, step, eval verdict, the model made and its stage."""
    state = f"/{j['state']}" if j.get("state") and j.get("state") != j["status"] else ""
    verdict = (j.get("eval") or {}).get("verdict")
    made = j.get("fine_tuned_model") or ""
    parts = [j["id"], f"{j['status']}{state:<14}", str(j.get("model")), f"file={j.get('training_file')}",
             step_text(j.get("progress")), f"eval={verdict}" if verdict else "", _when(j.get("created_at")),
             made + (f" ({stage})" if made and stage else "")]
    return "  ".join(p for p in parts if p)


QUARANTINE_ADVICE = (
    "what to try: more epochs (--epochs) or a larger learning rate (--learning-rate-multiplier) if the holdout "
    "did not improve; more, cleaner or less repetitive examples (`whet datasets check FILE`); a validation file "
    "that matches the task (--validation-file); or, deliberately, a lower bar for this job "
    "(`eval_config` in the job's API body, see services/eval/README.md)")


def describe_job(j: dict, stage: str | None = None) -> str:
    lines = [job_line(j, stage)]
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
        if ev.get("verdict") == "failed":
            failed = [s for s in ev.get("stages") or [] if s.get("status") == "failed"]
            lines.append("  the model did not pass the eval gate and is quarantined (never served or promoted)"
                         + (": " + "; ".join(f"{s.get('name')}: {s.get('reason')}" for s in failed) if failed else ""))
            lines.append(f"  {QUARANTINE_ADVICE}")
    if j.get("trained_tokens") is not None:
        lines.append(f"  trained_tokens {j['trained_tokens']}")
    return "\n".join(lines)


def checkpoint_line(c: dict) -> str:
    m = {k: v for k, v in (c.get("metrics") or {}).items() if v is not None and k != "step"}
    shown = "  ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in m.items())
    return (f"{c['id']}  step {c.get('step_number'):<6} {c.get('kind', ''):<10} {_when(c.get('created_at'))}  "
            f"{shown}  {c.get('fine_tuned_model_checkpoint') or ''}").rstrip()


def follow_job(api: Api, job_id: str, *, loss_png: str | None = None, quiet: bool = False) -> dict:
    curve = LossCurve()
    job = follow(api, job_id, quiet=quiet, curve=curve)
    if loss_png:
        curve.add_events(all_events(api, job_id))
        if len(curve.points) >= 2:
            title = f"{job_id} ({job['status']})"
            print(f"loss curve: {curve.save_png(Path(loss_png), title)} ({len(curve.points)} points)", file=sys.stderr)
        else:
            print(f"loss curve: not written, {len(curve.points)} loss point(s) reported", file=sys.stderr)
    return job


def model_stages(api: Api) -> dict[str, str]:
    """job id -> the stage of the model it made (best effort: an unreachable registry shows none)."""
    try:
        return {m["job_id"]: m.get("stage") for m in api.get("/models", limit=1000).get("data") or []
                if m.get("job_id")}
    except ApiFailure:
        return {}


def cmd_jobs(args: argparse.Namespace) -> int:
    with Api() as api:
        if args.action == "create":
            headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
            job = api.post("/fine_tuning/jobs", job_body(args), headers=headers)
            if args.follow:
                job = follow_job(api, job["id"], loss_png=args.loss_png, quiet=args.json)
            _out(args, job, describe_job(job, model_stages(api).get(job["id"]) if args.follow else None))
            if not args.json:
                print(job["id"])
            return 0 if job["status"] != "failed" else 1
        if args.action == "list":
            from .public import list_object  # noqa: PLC0415

            page = list_object(api, "/fine_tuning/jobs", args.limit, args.all)
            stages = {} if args.json else model_stages(api)
            _out(args, page, "\n".join(job_line(j, stages.get(j["id"])) for j in page["data"]) or "no jobs")
            return 0
        if args.action == "get":
            job = api.get(f"/fine_tuning/jobs/{args.job_id}")
            _out(args, job, describe_job(job, None if args.json else model_stages(api).get(job["id"])))
            return 0
        if args.action == "cancel":
            job = api.post(f"/fine_tuning/jobs/{args.job_id}/cancel")
            _out(args, job, describe_job(job))
            return 0
        if args.action == "follow":
            job = follow_job(api, args.job_id, loss_png=args.loss_png, quiet=args.json)
            _out(args, job, describe_job(job, None if args.json else model_stages(api).get(job["id"])))
            return 0 if job["status"] == "succeeded" else 1
        if args.action == "checkpoints":
            page = api.get(f"/fine_tuning/jobs/{args.job_id}/checkpoints", limit=args.limit)
            _out(args, page, "\n".join(checkpoint_line(c) for c in page.get("data") or []) or "no checkpoints")
            return 0
        if args.all:
            events = all_events(api, args.job_id)
            page = {"object": "list", "data": events, "has_more": False}
        else:
            page = api.events(args.job_id, limit=args.limit)
            events = list(reversed(page["data"]))
        _out(args, page, "\n".join(f"{_when(e.get('created_at'))}  {e.get('level', ''):<7} {e.get('message')}"
                                   for e in events) or "no events")
        return 0


def add_parser(sub, cmd) -> Any:
    jobs = sub.add_parser("jobs", help="fine-tuning jobs: create, follow, list, cancel, events, checkpoints, trace",
                          description="Fine-tuning jobs over the public API (WHETSTONE_BASE_URL, WHETSTONE_API_KEY).")
    acts = jobs.add_subparsers(dest="action", required=True, metavar="ACTION")
    cj = cmd(acts, "create", cmd_jobs, "create a fine-tuning job; its id on the last line")
    cj.add_argument("--training-file", required=True, help="a file id from `whet files upload` (file-…)")
    cj.add_argument("--validation-file", help="a file id held out for validation and the eval gate's holdout "
                                              "(default: a split of the training file)")
    cj.add_argument("--model", default=DEFAULT_MODEL, help=f"base model: a catalog name, a local directory or a "
                                                           f"Hub id (default: {DEFAULT_MODEL}, the tiny model that "
                                                           f"`whet models create-tiny` builds)")
    cj.add_argument("--method", default="supervised",
                    help="supervised (LoRA, the default) | dpo | lora | qlora | full | cpt | orpo")
    cj.add_argument("--epochs", type=int, help="passes over the training file (n_epochs; default: the method's)")
    cj.add_argument("--learning-rate", type=float,
                    help="an ABSOLUTE learning rate, e.g. 2e-4 (the platform's own hyperparameter)")
    cj.add_argument("--learning-rate-multiplier", type=float,
                    help="OpenAI's factor times the method's default learning rate, e.g. 2 (use one of the two)")
    cj.add_argument("--batch-size", type=int, help="examples per optimizer step (default: the method's)")
    cj.add_argument("--hp", action="append", metavar="KEY=VALUE",
                    help="any other hyperparameter (value as JSON), e.g. --hp lora_r=16; repeatable")
    cj.add_argument("--suffix", help="names the model: ft:<base>:<tenant>:<suffix>; versions of one suffix share it")
    cj.add_argument("--seed", type=int, help="training seed (same seed + data + settings: same result)")
    cj.add_argument("--idempotency-key", help="retries with the same key and body return the same job")
    cj.add_argument("--follow", action="store_true", help="show progress until the job ends")
    cj.add_argument("--loss-png", metavar="FILE", help="with --follow: write the training loss curve to this PNG")
    jl = cmd(acts, "list", cmd_jobs, "the key's tenant's jobs, newest first: status, step, eval verdict, model stage")
    jl.add_argument("--limit", type=int, default=20, help="jobs per page (default 20)")
    jl.add_argument("--all", action="store_true", help="every page")
    cmd(acts, "get", cmd_jobs, "one job, with its eval verdict and why").add_argument("job_id")
    cmd(acts, "cancel", cmd_jobs, "cancel a job that has not finished").add_argument("job_id")
    jf = cmd(acts, "follow", cmd_jobs, "progress (step, loss, ETA) until the job ends")
    jf.add_argument("job_id")
    jf.add_argument("--loss-png", metavar="FILE", help="write the training loss curve to this PNG at the end")
    je = cmd(acts, "events", cmd_jobs, "the job's events, oldest first")
    je.add_argument("job_id")
    je.add_argument("--limit", type=int, default=50, help="the newest N events (default 50)")
    je.add_argument("--all", action="store_true", help="every event")
    jc = cmd(acts, "checkpoints", cmd_jobs, "the job's checkpoints with their metrics (train/valid loss, accuracy)")
    jc.add_argument("job_id")
    jc.add_argument("--limit", type=int, default=10, help="checkpoints per page (default 10)")
    return jobs
