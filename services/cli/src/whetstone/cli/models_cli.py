"""`whet models list|get|promote|rollback|archive|download` and `whet usage`: readable text by default,
the API's own objects with `--json`."""

from __future__ import annotations

import argparse
import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from .client import Api, ApiFailure, dumps

STAGES = ("dev", "staging", "production", "archived")


def _when(ts: Any) -> str:
    if isinstance(ts, (int, float)):
        return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return str(ts)[:19].replace("T", " ") if ts else "-"


def _out(args: argparse.Namespace, obj: Any, text: str) -> None:
    print(dumps(obj) if args.json else text)


def model_line(m: dict) -> str:
    kind = m.get("model_type") or ("base" if not m.get("job_id") else "fine_tuned")
    job = f"  job={m['job_id']}" if m.get("job_id") else ""
    return f"{m['id']}  {kind:<10} stage={m.get('stage') or '-':<11} {m.get('name') or ''}{job}".rstrip()


def _short(sha: Any) -> str:
    return f"{str(sha)[:12]}…" if sha else "-"


def describe_model(m: dict) -> str:
    """A model in a few readable lines: what it is, where it came from, how it got its stage."""
    lines = [model_line(m)]
    if m.get("fine_tuned_model") and m.get("stage") in ("staging", "production"):   # only those are served
        lines.append(f"  chat with      model={m['fine_tuned_model']}")
    lin = m.get("lineage") or {}
    if lin:
        lines.append(f"  base           {lin.get('base_model')} (sha256 {_short(lin.get('base_model_sha256'))})")
        lines.append(f"  dataset        {lin.get('dataset_id')} (version {_short(lin.get('dataset_version'))})")
        lines.append(f"  method         {lin.get('method')}  hyperparameters {_short(lin.get('hyperparameters_hash'))}")
        if lin.get("eval_verdict") or lin.get("eval"):
            lines.append(f"  eval           {lin.get('eval_verdict') or json.dumps(lin.get('eval'))[:100]}")
    if m.get("needs_reeval"):
        lines.append("  needs re-evaluation: its base model has a new version")
    for h in m.get("stage_history") or []:
        change = f"{h.get('from_stage') or '-'} -> {h.get('to_stage') or h.get('stage')}"
        by = h.get("actor") or h.get("approved_by") or ""
        lines.append(f"  {_when(h.get('at') or h.get('created_at')):<19}  {change:<24} {h.get('reason') or ''}"
                     + (f"  ({by})" if by else ""))
    lines.append("  (lineage, files and eval in full: --json)")
    return "\n".join(lines)


def download(api: Api, model_id: str, out: Path) -> tuple[dict, list[Path]]:
    """Every file of the model's content listing into `out`, each checked against its sha256."""
    content = api.get(f"/models/{model_id}/content")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with httpx.Client(timeout=300, follow_redirects=True) as http:
        for f in content.get("files") or []:
            target = out / Path(f["name"]).name
            digest = hashlib.sha256()
            with http.stream("GET", f["url"]) as r:
                if r.status_code != 200:
                    raise ApiFailure(r.status_code, {"code": "download_failed",
                                                     "message": f"{f['name']}: the object store answered "
                                                                f"{r.status_code} at {f['url'].split('?')[0]}"})
                with open(target, "wb") as fh:
                    for chunk in r.iter_bytes():
                        digest.update(chunk)
                        fh.write(chunk)
            if f.get("sha256") and digest.hexdigest() != f["sha256"]:
                target.unlink(missing_ok=True)
                raise ApiFailure(422, {"code": "checksum_mismatch",
                                       "message": f"{f['name']} does not match its sha256; nothing kept"})
            written.append(target)
    return content, written


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
            page = api.get("/models", job_id=args.job)
            _out(args, page, "\n".join(model_line(m) for m in page.get("data") or []) or "no models")
        elif args.action == "get":
            m = api.get(f"/models/{args.model_id}")
            _out(args, m, describe_model(m))
        elif args.action == "promote":
            m = api.post(f"/models/{args.model_id}/promote", {"stage": args.stage, "reason": args.reason})
            _out(args, m, model_line(m))
        elif args.action == "archive":
            m = api.post(f"/models/{args.model_id}/archive", {"reason": args.reason})
            _out(args, m, model_line(m))
        elif args.action == "download":
            out = Path(args.out or args.model_id.replace(":", "_"))
            content, files = download(api, args.model_id, out)
            _out(args, content, "\n".join(f"{p}  {p.stat().st_size} bytes  sha256 ok" for p in files)
                 + "\n" + load_hint(content.get("base_model") or "", out))
            if not args.json:
                print(out)
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


def month_text(u: dict) -> str:
    rate = u.get("success_rate")
    lines = [f"{u.get('tenant_id')}  {u.get('month')}",
             f"  jobs       {u.get('jobs', 0)}  (succeeded {u.get('succeeded', 0)}, failed {u.get('failed', 0)}, "
             f"cancelled {u.get('cancelled', 0)}" + (f"; {rate:.0%} succeeded)" if rate is not None else ")"),
             f"  GPU hours  {u.get('gpu_hours', 0):.4f}  (billable {u.get('billable_gpu_hours', 0):.4f})",
             f"  spend      {u.get('spend', 0):.6f} {u.get('currency', 'USD')}  (refunded {u.get('refunded', 0):.6f}, "
             f"under review {u.get('under_review', 0):.6f})"]
    for g in u.get("by_gpu_type") or []:
        lines.append(f"  {g['gpu_type']:<12} {g['gpu_hours']:.4f} h  {g['spend']:.6f} {u.get('currency', 'USD')}")
    return "\n".join(lines)


def cmd_usage(args: argparse.Namespace) -> int:
    with Api() as api:
        if args.job:
            u = api.get(f"/usage/jobs/{args.job}")
            _out(args, u, usage_text(u))
        else:
            month = args.month or datetime.now(UTC).strftime("%Y-%m")
            u = api.get("/usage", month=month)   # the key's own tenant
            _out(args, u, month_text(u))
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
    mp.add_argument("--reason", default="", help="kept in the model's stage history")
    mr = cmd(mods, "rollback", cmd_models, "put the previous production version of this name back into production")
    mr.add_argument("model_id")
    mr.add_argument("--reason", default="", help="kept in the model's stage history")
    ma = cmd(mods, "archive", cmd_models, "archive a model (no longer served)")
    ma.add_argument("model_id")
    ma.add_argument("--reason", default="", help="kept in the model's stage history")
    md = cmd(mods, "download", cmd_models, "download the adapter (safetensors, adapter_config.json, tokenizer, "
                                           "model card), each file checked against its sha256")
    md.add_argument("model_id")
    md.add_argument("--out", help="directory to write (default: the model id); its path is on the last line")

    us = cmd(sub, "usage", cmd_usage, "metered GPU usage: one job (--job) or the key's tenant's month")
    us.add_argument("--job", help="a job id: its segments, GPU-seconds, cost and charge class")
    us.add_argument("--month", help="YYYY-MM (default: this month)")
    return models
