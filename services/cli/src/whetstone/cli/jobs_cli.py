"""`whet jobs create|reproduce|list|get|cancel|pause|resume|follow|events|checkpoints`: fine-tuning jobs over the
public API."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .api_objects import (
    Checkpoint,
    Job,
    JobEvent,
    Page,
    PlatformMethod,
    Progress,
    RegistryModel,
)
from .client import Api, ApiFailure
from .errors import BadInput
from .follow import LossCurve, all_events, follow
from .graders_cli import read_grader, read_json_file
from .output import add_list_options, list_object, print_result, when

if TYPE_CHECKING:
    from .job_request import CreateJob, Family, Hyperparams, MethodSpec, PlatformName

PLATFORM_METHODS: dict[PlatformName, Family] = {"lora": "supervised", "qlora": "supervised", "full": "supervised",
                                                "cpt": "supervised", "dpo": "dpo", "orpo": "dpo"}
DEFAULT_MODEL = "tiny-llama"


def job_body(args: argparse.Namespace) -> CreateJob:
    """OpenAI's create body: `method` as an object, the platform method as its `whetstone` extension."""
    from .job_request import CreateJob, checked_body, method_spec

    hp: Hyperparams = {k: v for k, v in {"n_epochs": args.epochs, "learning_rate": args.learning_rate,
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
    if getattr(args, "qlora", False) and method != "reinforcement":
        raise BadInput("--qlora is for --method reinforcement (supervised QLoRA is --method qlora)")
    with checked_body():
        if method == "reinforcement" or getattr(args, "grader", None):
            spec = reinforcement_method(args, hp)
        elif method in ("supervised", "dpo"):
            spec = method_spec(method, None, hp)
        elif method in PLATFORM_METHODS:
            spec = method_spec(PLATFORM_METHODS[method], method, hp)
        else:
            raise SystemExit(f"unknown method {method!r}: supervised, dpo, reinforcement, " + ", ".join(PLATFORM_METHODS))
        return CreateJob(model=args.model, training_file=args.training_file, method=spec,
                         validation_file=getattr(args, "validation_file", None), suffix=getattr(args, "suffix", None),
                         seed=getattr(args, "seed", None))


def reinforcement_method(args: argparse.Namespace, hp: Hyperparams) -> MethodSpec:
    """OpenAI's `{"type": "reinforcement", "reinforcement": {grader, hyperparameters, response_format}}`,
    the grader read from `--grader FILE` (checked locally first: graders_cli.read_grader)."""
    from .job_request import ReinforcementBody, reinforcement_spec

    if args.method != "reinforcement":
        raise BadInput(f"--grader is for --method reinforcement, not {args.method!r}")
    if not args.grader:
        raise BadInput("--method reinforcement needs --grader FILE (a grader JSON file; "
                       "try it first with `whet graders run FILE --sample ... --item ...`)")
    if "learning_rate" in hp:
        raise BadInput("--learning-rate: a reinforcement job takes --learning-rate-multiplier (OpenAI's knob)")
    hp.update({k: v for k, v in {"compute_multiplier": args.compute_multiplier, "eval_interval": args.eval_interval,
                                 "eval_samples": args.eval_samples,
                                 "reasoning_effort": args.reasoning_effort}.items() if v is not None})
    body = ReinforcementBody(grader=read_grader(args.grader), hyperparameters=hp or None,
                             response_format=read_json_file(args.response_format, "response format")
                             if args.response_format else None)
    return reinforcement_spec(body, qlora=args.qlora)


def step_text(progress: Progress | None) -> str:
    """`step 12/40`, `step 12` while the total is unknown, '' before the first step."""
    p = progress or Progress()
    if not isinstance(p.step, int):
        return ""
    return f"step {p.step}/{p.total_steps}" if p.total_steps else f"step {p.step}"


def job_line(j: Job, stage: str | None = None) -> str:
    """One job: status (and finer state), model, file, step, eval verdict, the model made and its stage."""
    state = f"/{j.state}" if j.state and j.state != j.status else ""
    verdict = j.eval.verdict if j.eval is not None else None
    made = j.fine_tuned_model or ""
    parts = [j.id, f"{j.status}{state:<14}", str(j.model), f"file={j.training_file}",
             step_text(j.progress), f"eval={verdict}" if verdict else "", when(j.created_at),
             made + (f" ({stage})" if made and stage else "")]
    return "  ".join(p for p in parts if p)


QUARANTINE_ADVICE = (
    "what to try: more epochs (--epochs) or a larger learning rate (--learning-rate-multiplier) if the holdout "
    "did not improve; more, cleaner or less repetitive examples (`whet datasets check FILE`); a validation file "
    "that matches the task (--validation-file); or, deliberately, a lower bar for this job "
    "(`eval_config` in the job's API body, see services/eval/README.md)")


def describe_job(j: Job, stage: str | None = None) -> str:
    lines = [job_line(j, stage)]
    if j.method is not None:
        platform = j.method.whetstone or PlatformMethod()
        lines.append(f"  method {j.method.type} ({platform.method})  "
                     f"hyperparameters {json.dumps(j.hyperparameters.to_dict() if j.hyperparameters else None)}")
        if (rl := j.method.reinforcement) is not None and rl.grader is not None:
            lines.append(f"  grader {rl.grader.name} ({rl.grader.type})")
    if j.error is not None and any(j.error.to_dict().values()):
        lines.append(f"  error  {j.error.code}: {j.error.message}")
    ev = j.eval
    if ev is not None:
        lines.append(f"  eval   verdict={ev.verdict}  " + "; ".join(ev.reasons or []))
        for m in ev.metrics or []:
            base = f"{m.base:.4f}" if isinstance(m.base, (int, float)) else "-"
            cand = f"{m.candidate:.4f}" if isinstance(m.candidate, (int, float)) else "-"
            lines.append(f"         {m.name:<20} base={base:<10} candidate={cand}")
        if ev.verdict == "failed":
            failed = [s for s in ev.stages or [] if s.status == "failed"]
            lines.append("  the model did not pass the eval gate and is quarantined (never served or promoted)"
                         + (": " + "; ".join(f"{s.name}: {s.reason}" for s in failed) if failed else ""))
            lines.append(f"  {QUARANTINE_ADVICE}")
    if j.trained_tokens is not None:
        lines.append(f"  trained_tokens {j.trained_tokens}")
    return "\n".join(lines)


def checkpoint_line(c: Checkpoint) -> str:
    """One checkpoint: id, step, kind, time, its measured metrics (OpenAI's names) and its model name."""
    m = c.metrics
    named = [("train_loss", m.train_loss), ("train_mean_token_accuracy", m.train_mean_token_accuracy),
             ("valid_loss", m.valid_loss), ("valid_mean_token_accuracy", m.valid_mean_token_accuracy),
             ("full_valid_loss", m.full_valid_loss),
             ("full_valid_mean_token_accuracy", m.full_valid_mean_token_accuracy)] if m is not None else []
    measured = [(k, v) for k, v in [*named, *((m.model_extra or {}).items() if m is not None else ())]
                if v is not None]
    shown = "  ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in measured)
    return (f"{c.id}  step {c.step_number:<6} {c.kind or '':<10} {when(c.created_at)}  "
            f"{shown}  {c.fine_tuned_model_checkpoint or ''}").rstrip()


def follow_job(api: Api, job_id: str, *, loss_png: str | None = None, quiet: bool = False) -> tuple[Job, dict]:
    """`follow`, then the loss curve to `loss_png`: the terminal job and the API's JSON of it."""
    curve = LossCurve()
    job, raw = follow(api, job_id, quiet=quiet, curve=curve)
    if loss_png:
        curve.add_events([event for event, _ in all_events(api, job_id)])
        if len(curve.points) >= 2:
            title = f"{job_id} ({job.status})"
            print(f"loss curve: {curve.save_png(Path(loss_png), title)} ({len(curve.points)} points)", file=sys.stderr)
        else:
            print(f"loss curve: not written, {len(curve.points)} loss point(s) reported", file=sys.stderr)
    return job, raw


def model_stages(api: Api) -> dict[str, str | None]:
    """job id -> the stage of the model it made (best effort: an unreachable registry shows none)."""
    try:
        models = Page[RegistryModel].from_api(api.get("/models", limit=1000)).data or []
    except ApiFailure:
        return {}
    return {m.job_id: m.stage for m in models if m.job_id}


def cmd_jobs(args: argparse.Namespace) -> int:
    from .job_request import request_json
    from .reproduce import JobAnswer, reproduce_body

    with Api() as api:
        if args.action == "create":
            headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
            raw = api.post("/fine_tuning/jobs", request_json(job_body(args)), headers=headers)
            job = Job.from_api(raw)
            if args.follow:
                job, raw = follow_job(api, job.id, loss_png=args.loss_png, quiet=args.json)
            print_result(args, raw, describe_job(job, model_stages(api).get(job.id) if args.follow else None))
            if not args.json:
                print(job.id)
            return 0 if job.status != "failed" else 1
        if args.action == "reproduce":
            body = reproduce_body(JobAnswer.from_api(api.get(f"/fine_tuning/jobs/{args.job_id}")))
            job = Job.from_api(raw := api.post("/fine_tuning/jobs", request_json(body)))
            if args.follow:
                job, raw = follow_job(api, job.id, quiet=args.json)
            print_result(args, raw, describe_job(job))
            if not args.json:
                print(job.id)
            return 0 if job.status != "failed" else 1
        if args.action == "list":
            raw = list_object(api, "/fine_tuning/jobs", args.limit, args.all)
            stages = {} if args.json else model_stages(api)
            jobs = Page[Job].from_api(raw).data or []
            print_result(args, raw, "\n".join(job_line(j, stages.get(j.id)) for j in jobs) or "no jobs")
            return 0
        if args.action == "get":
            raw = api.get(f"/fine_tuning/jobs/{args.job_id}")
            job = Job.from_api(raw)
            print_result(args, raw, describe_job(job, None if args.json else model_stages(api).get(job.id)))
            return 0
        if args.action in ("cancel", "pause", "resume"):
            raw = api.post(f"/fine_tuning/jobs/{args.job_id}/{args.action}")
            print_result(args, raw, describe_job(Job.from_api(raw)))
            return 0
        if args.action == "follow":
            job, raw = follow_job(api, args.job_id, loss_png=args.loss_png, quiet=args.json)
            print_result(args, raw, describe_job(job, None if args.json else model_stages(api).get(job.id)))
            return 0 if job.status == "succeeded" else 1
        if args.action == "checkpoints":
            raw = api.get(f"/fine_tuning/jobs/{args.job_id}/checkpoints", limit=args.limit)
            checkpoints = Page[Checkpoint].from_api(raw).data or []
            print_result(args, raw, "\n".join(checkpoint_line(c) for c in checkpoints) or "no checkpoints")
            return 0
        if args.all:
            gathered = all_events(api, args.job_id)
            events = [event for event, _ in gathered]
            raw = {"object": "list", "data": [event_json for _, event_json in gathered], "has_more": False}
        else:
            raw = api.events(args.job_id, limit=args.limit)
            events = list(reversed(Page[JobEvent].from_api(raw).data or []))
        print_result(args, raw, "\n".join(f"{when(e.created_at)}  {e.level or '':<7} {e.message}"
                                           for e in events) or "no events")
        return 0


def add_parser(sub, cmd) -> Any:
    jobs = sub.add_parser("jobs", help="fine-tuning jobs: create, reproduce, follow, list, cancel, pause, resume, "
                                       "events, checkpoints, trace",
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
                    help="supervised (LoRA, the default) | dpo | reinforcement (with --grader) | lora | qlora | "
                         "full | cpt | orpo")
    cj.add_argument("--grader", metavar="FILE", help="reinforcement: the grader JSON file (OpenAI's grader object; "
                                                     "`whet graders validate FILE` checks it)")
    cj.add_argument("--compute-multiplier", type=float, help="reinforcement: samples per prompt, relative")
    cj.add_argument("--eval-interval", type=int, help="reinforcement: steps between validation-reward evaluations")
    cj.add_argument("--eval-samples", type=int, help="reinforcement: completions per validation prompt")
    cj.add_argument("--reasoning-effort", choices=("default", "low", "medium", "high"),
                    help="reinforcement: the completion budget (low/default/medium/high)")
    cj.add_argument("--qlora", action="store_true", help="reinforcement: train the LoRA adapter on a 4-bit NF4 "
                                                          "base (QLoRA; less memory)")
    cj.add_argument("--response-format", metavar="FILE", help="reinforcement: a JSON file with the response_format "
                                                              "(json_schema) the samples should follow")
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
    jr = cmd(acts, "reproduce", cmd_jobs, "train a job again with everything pinned (same files, base model "
                                          "sha256 / Hub commit, resolved hyperparameters and seed); its id on the "
                                          "last line")
    jr.add_argument("job_id")
    jr.add_argument("--follow", action="store_true", help="show progress until the job ends")
    add_list_options(cmd(acts, "list", cmd_jobs, "the key's tenant's jobs, newest first: status, step, eval verdict, "
                                                 "model stage"), "jobs")
    cmd(acts, "get", cmd_jobs, "one job, with its eval verdict and why").add_argument("job_id")
    cmd(acts, "cancel", cmd_jobs, "cancel a job that has not finished").add_argument("job_id")
    cmd(acts, "pause", cmd_jobs, "pause a queued or running job (emergency checkpoint, GPUs released; "
                                 "billed for the time it ran)").add_argument("job_id")
    cmd(acts, "resume", cmd_jobs, "queue a paused job again; it resumes from its checkpoint").add_argument("job_id")
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
