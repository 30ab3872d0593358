"""`whet files|jobs|models|usage`: the public API from the command line (WHETSTONE_API_KEY,
WHETSTONE_BASE_URL). `--json` prints the API's objects for scripts (a list: the API's list object);
the id a command creates is always on its last line. Jobs are in jobs_cli, models and usage in models_cli."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import jobs_cli, models_cli
from .client import Api, ApiFailure, dumps, poll_until
from .follow import TERMINAL


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


def _list_object(api: Api, path: str, limit: int, everything: bool, **params: Any) -> dict:
    """The API's list object; with `everything`, every page gathered into one (`has_more` false)."""
    if not everything:
        return api.get(path, limit=limit, **params)
    data = list(api.pages(path, limit=min(limit, 100), **params))
    return {"object": "list", "data": data, "has_more": False,
            "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}


def cmd_files(args: argparse.Namespace) -> int:
    with Api() as api:
        if args.action == "upload":
            path = Path(args.file)
            if not path.is_file():
                print(f"error: no such file: {path}", file=sys.stderr)
                return 2
            f = api.upload(path, args.purpose)
            if args.wait:
                f = wait_for_file(api, f["id"])
            _out(args, f, describe_file(f))
            if not args.json:
                print(f["id"])
            return 1 if f["status"] == "error" else 0
        if args.action == "list":
            page = _list_object(api, "/files", args.limit, args.all)
            _out(args, page, "\n".join(file_line(f) for f in page["data"]) or "no files")
            return 0
        if args.action == "delete":
            gone = api.call("DELETE", f"/files/{args.file_id}")
            _out(args, gone, f"deleted {gone.get('id', args.file_id)}")
            return 0
        f = api.get(f"/files/{args.file_id}")
        _out(args, f, describe_file(f))
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
    def cmd(parent, name: str, fn, help_: str):
        p = parent.add_parser(name, help=help_, description=help_[:1].upper() + help_[1:] + ".")
        p.add_argument("--json", action="store_true", help="print the API's own JSON object (lists: the list object)")
        p.set_defaults(fn=guarded(fn))
        return p

    files = sub.add_parser("files", help="training files: upload (validated before any GPU time), list, get, delete",
                           description="Training files over the public API (WHETSTONE_BASE_URL, WHETSTONE_API_KEY).")
    acts = files.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = cmd(acts, "upload", cmd_files, "upload a training file (JSONL, streamed); its id on the last line")
    up.add_argument("file", help="chat (`messages`), preference (`input`/`preferred_output`/...) or text rows")
    up.add_argument("--purpose", default="fine-tune", help="OpenAI's purpose (default fine-tune)")
    up.add_argument("--wait", action="store_true", help="wait for the validation report (exit 1 if rejected)")
    lst = cmd(acts, "list", cmd_files, "the key's tenant's files, newest first")
    lst.add_argument("--limit", type=int, default=20, help="files per page (default 20)")
    lst.add_argument("--all", action="store_true", help="every page")
    cmd(acts, "get", cmd_files, "one file with its validation report").add_argument("file_id")
    cmd(acts, "delete", cmd_files, "delete a file (refused while a job that trains on it runs)").add_argument(
        "file_id")

    jobs_cli.add_parser(sub, cmd)
    models_cli.add_parsers(sub, cmd)


# what the demo and the tests use from here
list_object = _list_object
job_body, describe_job, follow_job, job_line = jobs_cli.job_body, jobs_cli.describe_job, jobs_cli.follow_job, \
    jobs_cli.job_line
usage_text = models_cli.usage_text

__all__ = ["TERMINAL", "add_parsers", "follow_job", "wait_for_file", "describe_job", "describe_file", "usage_text",
           "job_body", "list_object"]
