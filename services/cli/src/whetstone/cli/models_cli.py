"""`whet models list|get|promote|rollback|archive|download` and `whet usage`: readable text by default,
the API's own objects with `--json`."""

from __future__ import annotations

import argparse
import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

import httpx

from .api_objects import (
    JobUsage,
    Lineage,
    ModelContent,
    MonthUsage,
    Page,
    RegistryModel,
    UsageTotal,
)
from .client import Api, ApiFailure, ErrorBody
from .output import print_result, when

STAGES = ("dev", "staging", "production", "archived")


def _when(ts: float | str | None) -> str:
    """A Unix timestamp or an ISO time as `YYYY-mm-dd HH:MM:SS`; `-` when there is none."""
    if isinstance(ts, (int, float)):
        return when(ts)
    return str(ts)[:19].replace("T", " ") if ts else "-"


def model_line(m: RegistryModel) -> str:
    kind = m.model_type or ("base" if not m.job_id else "fine_tuned")
    job = f"  job={m.job_id}" if m.job_id else ""
    return f"{m.id}  {kind:<10} stage={m.stage or '-':<11} {m.name or ''}{job}".rstrip()


def _short(sha: str | None) -> str:
    return f"{str(sha)[:12]}…" if sha else "-"


def describe_model(m: RegistryModel) -> str:
    """A model in a few readable lines: what it is, where it came from, how it got its stage."""
    lines = [model_line(m)]
    if m.fine_tuned_model and m.stage in ("staging", "production"):   # only those are served
        lines.append(f"  chat with      model={m.fine_tuned_model}")
    lin = m.lineage or Lineage()
    if lin.to_dict():
        lines.append(f"  base           {lin.base_model} (sha256 {_short(lin.base_model_sha256)})")
        lines.append(f"  dataset        {lin.dataset_id} (version {_short(lin.dataset_version)})")
        lines.append(f"  method         {lin.method}  hyperparameters {_short(lin.hyperparameters_hash)}")
        if lin.eval_verdict or lin.eval:
            lines.append(f"  eval           {lin.eval_verdict or json.dumps(lin.eval)[:100]}")
    if m.needs_reeval:
        lines.append("  needs re-evaluation: its base model has a new version")
    for h in m.stage_history or []:
        change = f"{h.from_stage or '-'} -> {h.to_stage or h.stage}"
        by = h.actor or h.approved_by or ""
        lines.append(f"  {_when(h.at or h.created_at):<19}  {change:<24} {h.reason or ''}"
                     + (f"  ({by})" if by else ""))
    lines.append("  (lineage, files and eval in full: --json)")
    return "\n".join(lines)


def download(api: Api, model_id: str, out: Path) -> tuple[ModelContent, dict, list[Path]]:
    """Every file of the model's content listing into `out`, each checked against its sha256: the
    listing, the API's JSON of it and the files written."""
    raw = api.get(f"/models/{model_id}/content")
    content = ModelContent.from_api(raw)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    api_origin = httpx.URL(api.base_url).copy_with(path="/", query=None)
    with httpx.Client(timeout=300, follow_redirects=True) as http:
        for f in content.files or []:
            target = out / Path(f.name).name
            digest = hashlib.sha256()
            # a file served by the platform's API (its public_base_url setting) needs the key; a presigned
            # object-store URL carries its own signature and must not receive the key
            same_origin = httpx.URL(f.url).copy_with(path="/", query=None) == api_origin
            headers = {"Authorization": api.http.headers["Authorization"]} if same_origin else {}
            with http.stream("GET", f.url, headers=headers) as r:
                if r.status_code != 200:
                    raise ApiFailure(r.status_code, ErrorBody(code="download_failed",
                                                              message=f"{f.name}: the download server answered "
                                                                      f"{r.status_code} at {f.url.split('?')[0]}"))
                with open(target, "wb") as fh:
                    for chunk in r.iter_bytes():
                        digest.update(chunk)
                        fh.write(chunk)
            if f.sha256 and digest.hexdigest() != f.sha256:
                target.unlink(missing_ok=True)
                raise ApiFailure(422, ErrorBody(code="checksum_mismatch",
                                                message=f"{f.name} does not match its sha256; nothing kept"))
            written.append(target)
    return content, raw, written


def load_hint(base: str, out: Path) -> str:
    """How to load the adapter: a Hub base resolves from adapter_config.json (id + pinned revision); a
    local catalog base is named by its catalog name, so the base is loaded from the user's copy."""
    if "/" in base:
        return (f"base model {base} (Hub; adapter_config.json pins its revision); load with:\n"
                f"  from peft import AutoPeftModelForCausalLM\n"
                f"  model = AutoPeftModelForCausalLM.from_pretrained({str(out)!r})")
    return (f"base model {base} (the platform's local catalog: on its machine <data dir>/models/{base}); load with:\n"
            f"  from peft import PeftModel; from transformers import AutoModelForCausalLM\n"
            f"  model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained('<your copy of {base}>'), "
            f"{str(out)!r})")


def cmd_models(args: argparse.Namespace) -> int:
    with Api() as api:
        if args.action == "list":
            raw = api.get("/models", job_id=args.job)
            models = Page[RegistryModel].from_api(raw).data or []
            print_result(args, raw, "\n".join(model_line(m) for m in models) or "no models")
        elif args.action == "get":
            raw = api.get(f"/models/{args.model_id}")
            print_result(args, raw, describe_model(RegistryModel.from_api(raw)))
        elif args.action == "promote":
            raw = api.post(f"/models/{args.model_id}/promote", {"stage": args.stage, "reason": args.reason})
            print_result(args, raw, model_line(RegistryModel.from_api(raw)))
        elif args.action == "archive":
            raw = api.post(f"/models/{args.model_id}/archive", {"reason": args.reason})
            print_result(args, raw, model_line(RegistryModel.from_api(raw)))
        elif args.action == "download":
            out = Path(args.out or args.model_id.replace(":", "_"))
            content, raw, files = download(api, args.model_id, out)
            print_result(args, raw, "\n".join(f"{p}  {p.stat().st_size} bytes  sha256 ok" for p in files)
                         + "\n" + load_hint(content.base_model or "", out))
            if not args.json:
                print(out)
        else:
            raw = api.post(f"/models/{args.model_id}/rollback", {"reason": args.reason})
            print_result(args, raw, model_line(RegistryModel.from_api(raw)))
    return 0


# ----------------------------------------------------------------- usage


def usage_text(u: JobUsage) -> str:
    total = u.total or UsageTotal()
    return (f"{u.job_id}  status={u.status}  gpu_seconds={total.gpu_seconds:.1f}  "
            f"billable={total.billable_gpu_seconds:.1f}  cost=${total.cost:.6f}  "
            f"class={total.charge_class}  segments={len(u.lines or [])}")


def month_text(u: MonthUsage) -> str:
    rate = u.success_rate
    lines = [f"{u.tenant_id}  {u.month}",
             f"  jobs       {u.jobs}  (succeeded {u.succeeded}, failed {u.failed}, "
             f"cancelled {u.cancelled}" + (f"; {rate:.0%} succeeded)" if rate is not None else ")"),
             f"  GPU hours  {u.gpu_hours:.4f}  (billable {u.billable_gpu_hours:.4f})",
             f"  spend      {u.spend:.6f} {u.currency}  (refunded {u.refunded:.6f}, "
             f"under review {u.under_review:.6f})"]
    for g in u.by_gpu_type or []:
        lines.append(f"  {g.gpu_type:<12} {g.gpu_hours:.4f} h  {g.spend:.6f} {u.currency}")
    return "\n".join(lines)


def cmd_usage(args: argparse.Namespace) -> int:
    with Api() as api:
        if args.job:
            raw = api.get(f"/usage/jobs/{args.job}")
            print_result(args, raw, usage_text(JobUsage.from_api(raw)))
        else:
            month = args.month or datetime.now(UTC).strftime("%Y-%m")
            raw = api.get("/usage", month=month)   # the key's own tenant
            print_result(args, raw, month_text(MonthUsage.from_api(raw)))
    return 0


def add_parsers(sub, cmd) -> None:
    models = sub.add_parser("models", help="fine-tuned models (public API) and the local base-model catalog",
                            description="Fine-tuned models over the public API. Stages: dev -> staging -> production "
                                        "-> archived; a model that failed its eval gate is quarantined.")
    mods = models.add_subparsers(dest="action", required=True, metavar="ACTION")
    lst = cmd(mods, "list", cmd_models, "the key's tenant's models (fine-tuned versions, then base models)")
    lst.add_argument("--job", help="only the model made by this job")
    cmd(mods, "get", cmd_models, "one model: base, dataset, method, stage history").add_argument(
        "model_id", help="a model id or a fine_tuned_model name")
    mp = cmd(mods, "promote", cmd_models, "move a model to another stage (production needs the models:promote "
                                          "scope)")
    mp.add_argument("model_id")
    mp.add_argument("--stage", default="production", choices=STAGES[:3],
                    help="the stage to move to (default: production, the version chat requests by name get)")
    mp.add_argument("--reason", default="promoted with whet models promote",
                    help="kept in the model's stage history")
    mr = cmd(mods, "rollback", cmd_models, "put the previous production version of this name back into production")
    mr.add_argument("model_id")
    mr.add_argument("--reason", default="rolled back with whet models rollback",
                    help="kept in the model's stage history")
    ma = cmd(mods, "archive", cmd_models, "archive a model (no longer served)")
    ma.add_argument("model_id")
    ma.add_argument("--reason", default="archived with whet models archive",
                    help="kept in the model's stage history")
    md = cmd(mods, "download", cmd_models, "download the adapter (safetensors, adapter_config.json, tokenizer, "
                                           "model card), each file checked against its sha256")
    md.add_argument("model_id")
    md.add_argument("--out", help="directory to write (default: the model id); its path is on the last line")

    us = cmd(sub, "usage", cmd_usage, "metered GPU usage: one job (--job) or the key's tenant's month")
    us.add_argument("--job", help="a job id: its segments, GPU-seconds, cost and charge class")
    us.add_argument("--month", help="YYYY-MM (default: this month)")
    return models
