"""`whet files|jobs|graders|models|usage`: the public API from the command line (WHETSTONE_API_KEY,
WHETSTONE_BASE_URL). `--json` prints the API's objects for scripts (a list: the API's list object);
the id a command creates is always on its last line. Jobs are in jobs_cli, graders in graders_cli,
models and usage in models_cli."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import graders_cli, jobs_cli, models_cli
from .api_objects import ApiFile, FileDeleted, Page
from .client import Api, ApiFailure, poll_until
from .follow import TERMINAL
from .output import add_list_options, list_object, print_result, when

# ------------------------------------------------------------------ files


def file_line(f: ApiFile) -> str:
    return (f"{f.id}  {f.status:<9} {f.bytes or 0:>10}B  {f.purpose}/{f.dataset_purpose}"
            f"  {f.filename}  {when(f.created_at)}")


def wait_for_file(api: Api, file_id: str, timeout_s: float = 600) -> tuple[ApiFile, dict]:
    """The file once validated (status no longer `uploaded`), and the API's JSON of it."""
    def validated() -> tuple[ApiFile, dict] | None:
        raw = api.get(f"/files/{file_id}")
        f = ApiFile.from_api(raw)
        return (f, raw) if f.status != "uploaded" else None

    return poll_until(validated, f"validation of file {file_id}", timeout_s=timeout_s)


def describe_file(f: ApiFile) -> str:
    lines = [file_line(f)]
    v = f.validation
    if v is not None:
        lines.append(f"  validation: {v.status}  rows {v.rows_kept}/{v.rows_total}  "
                     f"format={v.format} schema={v.schema_} tokens={v.tokens_total}")
        for e in (v.errors or [])[:20]:
            where = f"line {e.line}: " if e.line else ""
            lines.append(f"  error   {where}{e.message} [{e.code}]")
        for w in (v.warnings or [])[:5]:
            lines.append(f"  warning {w.message} [{w.code}]")
    return "\n".join(lines)


def cmd_files(args: argparse.Namespace) -> int:
    with Api() as api:
        if args.action == "upload":
            path = Path(args.file)
            if not path.is_file():
                print(f"error: no such file: {path}", file=sys.stderr)
                return 2
            raw = api.upload(path, args.purpose)
            f = ApiFile.from_api(raw)
            if args.wait:
                f, raw = wait_for_file(api, f.id)
            print_result(args, raw, describe_file(f))
            if not args.json:
                print(f.id)
            return 1 if f.status == "error" else 0
        if args.action == "list":
            raw = list_object(api, "/files", args.limit, args.all)
            files = Page[ApiFile].from_api(raw).data or []
            print_result(args, raw, "\n".join(file_line(f) for f in files) or "no files")
            return 0
        if args.action == "delete":
            raw = api.call("DELETE", f"/files/{args.file_id}")
            print_result(args, raw, f"deleted {FileDeleted.construct(**raw).id or args.file_id}")
            return 0
        raw = api.get(f"/files/{args.file_id}")
        print_result(args, raw, describe_file(ApiFile.from_api(raw)))
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
    add_list_options(cmd(acts, "list", cmd_files, "the key's tenant's files, newest first"), "files")
    cmd(acts, "get", cmd_files, "one file with its validation report").add_argument("file_id")
    cmd(acts, "delete", cmd_files, "delete a file (refused while a job that trains on it runs)").add_argument(
        "file_id")

    jobs_cli.add_parser(sub, cmd)
    graders_cli.add_parser(sub, cmd)
    models_cli.add_parsers(sub, cmd)


# what the demo and the tests use from here
job_body, describe_job, follow_job, job_line = jobs_cli.job_body, jobs_cli.describe_job, jobs_cli.follow_job, \
    jobs_cli.job_line
usage_text = models_cli.usage_text

__all__ = ["TERMINAL", "add_parsers", "follow_job", "wait_for_file", "describe_job", "describe_file", "usage_text",
           "job_body", "list_object"]
