"""`whet datasets check FILE`: the service's data gate, offline, no stack.

    whet datasets check FILE [--purpose sft|dpo|cpt|eval] [--base-model PATH_OR_ID] [--json] ...

FILE is a JSONL/Parquet/CSV file, a `datasets` save_to_disk directory, an archive of one,
or a Hub dataset id (when the Hub is reachable). Exit code 0: accepted, 1: rejected,
2: usage error (bad arguments, no such file, base model not loadable).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from ..adapters.archives import SourceError
from ..adapters.formats import HubSource, hub_id, open_source
from ..adapters.tokenizer import BaseModelTokenizer, TokenizerUnavailable
from ..config import IngestSettings
from ..domain.issues import Issue
from ..domain.policies import CHOICES, PolicyError, PolicyOverrides
from ..domain.report import GateReport
from ..domain.schemas import PURPOSES
from ..usecases.gates import GateRequest, archive_limits, make_gate, reference_index, toxicity_classifier


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="whet datasets check", description="Validate a dataset offline, exactly as "
                                "the ingest service would.")
    p.add_argument("file", help="JSONL / Parquet / CSV file, save_to_disk directory, archive, or Hub dataset id")
    p.add_argument("--purpose", choices=PURPOSES, help="default: follow the detected schema")
    p.add_argument("--base-model", help="catalog name, local model directory or Hub id: exact token counts")
    p.add_argument("--json", action="store_true", help="print one JSON report on stdout")
    p.add_argument("--validation-file", help="a validation set to check with FILE (instead of the hash split)")
    p.add_argument("--reference", action="append", default=[], metavar="PATH",
                   help="your own eval/benchmark set (file or directory) for the contamination check; repeatable")
    p.add_argument("--max-seq-len", type=int)
    p.add_argument("--over-length", choices=CHOICES["over_length"])
    p.add_argument("--pii", choices=CHOICES["pii"])
    p.add_argument("--contamination", choices=CHOICES["contamination"])
    p.add_argument("--toxicity", choices=CHOICES["toxicity"])
    p.add_argument("--near-dup-threshold", type=float)
    p.add_argument("--min-examples", type=int)
    p.add_argument("--tier", default="standard", help="tenant tier for the example limit (free|standard|premium)")
    p.add_argument("--epochs", type=int, help="for the cost estimate (default 3)")
    p.add_argument("--output-dir", help="write the cleaned train/validation files here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _usage(message: str) -> int:
    print(f"whet datasets check: {message}", file=sys.stderr)
    return 2


def _progress_bar(enabled: bool):
    """A rich progress bar on stderr (only on a terminal); returns (callback, stop)."""
    from rich.console import Console  # noqa: PLC0415
    from rich.progress import (  # noqa: PLC0415
        BarColumn,
        DownloadColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
    )

    console = Console(stderr=True)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                   console=console, transient=True, disable=not (enabled and console.is_terminal))
    bar.start()
    tasks: dict[str, TaskID] = {}     # phase -> its bar

    def update(phase: str, done: int, total: int | None) -> None:
        if phase not in tasks:
            tasks[phase] = bar.add_task(phase, total=total)
        bar.update(tasks[phase], completed=done, total=total)
    return update, bar.stop


def _combined_source(train, validation):
    """FILE plus --validation-file as one stream (validation rows continue the line numbers)."""
    inner = train.records

    def records():
        last = 0
        for rec in inner():
            last = rec.line
            yield rec
        for rec in validation.records():
            rec.line += last
            if rec.issue is not None:
                rec.issue = Issue(rec.issue.code, rec.issue.message, rec.line, rec.issue.field)
            rec.origin = 1
            yield rec
    train.records = records
    train.has_validation = True
    return train


def check_main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    settings = IngestSettings()
    overrides = PolicyOverrides(max_seq_len=args.max_seq_len, over_length=args.over_length, pii=args.pii,
                                contamination=args.contamination, toxicity=args.toxicity,
                                near_dup_threshold=args.near_dup_threshold)
    if args.min_examples is not None:
        settings.min_examples = args.min_examples
    path = Path(args.file)
    hub = hub_id(args.file) if not path.exists() else None
    if not path.exists() and hub is None:
        return _usage(f"no such file: {path}")
    references = [Path(r) for r in args.reference]
    missing = [str(r) for r in references if not r.exists()]
    if missing:
        return _usage(f"no such reference set: {', '.join(missing)}")
    tokenizer = None
    if args.base_model:
        try:
            tokenizer = BaseModelTokenizer.load(args.base_model, _catalog())
        except TokenizerUnavailable as exc:
            return _usage(str(exc))
    problems: list[Issue] = []
    update, stop = _progress_bar(not args.quiet)
    try:
        request = GateRequest(purpose=args.purpose, tier=args.tier, base_model=args.base_model,
                              policy_overrides=overrides, epochs=args.epochs)
        gate = make_gate(settings, request, tokenizer=tokenizer,
                         references=reference_index(settings, references, problems),
                         toxicity=toxicity_classifier(settings), progress=update, warnings=problems)
    except PolicyError as exc:
        stop()
        return _usage(str(exc))
    try:
        report, files = _run(gate, settings, path, hub, args)
    finally:
        stop()
    _print(report, files, args.json)
    return 0 if report.accepted else 1


def _run(gate, settings: IngestSettings, path: Path, hub: str | None, args) -> tuple[GateReport, dict[str, str]]:
    """The report, and the cleaned files written with --output-dir."""
    with tempfile.TemporaryDirectory(prefix="whet-check-", dir=settings.work_dir) as tmp:
        tmpd = Path(tmp)
        try:
            source = HubSource.open(hub) if hub else open_source(
                path, workdir=tmpd / "source", max_line_bytes=settings.max_line_bytes,
                image_line_bytes=settings.max_record_bytes, limits=archive_limits(settings))
            if args.validation_file:
                validation = open_source(Path(args.validation_file), workdir=tmpd / "validation",
                                         max_line_bytes=settings.max_line_bytes,
                                         image_line_bytes=settings.max_record_bytes, limits=archive_limits(settings))
                source = _combined_source(source, validation)
        except SourceError as exc:
            return GateReport.rejected(exc.issue, file=str(hub or path)), {}
        result = gate.run(source, tmpd / "gate")
        files: dict[str, str] = {}
        if args.output_dir and result.accepted:
            out = Path(args.output_dir)
            out.mkdir(parents=True, exist_ok=True)
            for side, p in (("train", result.train_path), ("validation", result.validation_path)):
                if p:
                    target = out / f"{side}.jsonl"
                    shutil.copyfile(p, target)
                    files[f"{side}_file"] = str(target)
        return result.report, files


def _catalog() -> Path | None:
    from whetstone.runtime.settings import CommonSettings  # noqa: PLC0415

    return CommonSettings().model_catalog


def _print(gate_report: GateReport, files: dict[str, str], as_json: bool) -> None:
    if as_json:
        print(json.dumps({**gate_report.as_dict(), **files}, default=str))
        return
    r, c = gate_report, gate_report.counts
    verdict = "ACCEPTED" if r.accepted else "REJECTED"
    layout = f" ({r.layout})" if r.layout else ""
    print(f"{verdict}: {r.format} / {r.schema}{layout} — {c.rows_kept}/{c.rows_total} rows kept, {r.tokens_total} "
          f"tokens{' (estimated)' if r.tokens_estimated else ''}")
    print(f"  duplicates: {c.exact_duplicates} exact, {c.near_duplicates} near; contaminated: {c.contaminated}; "
          f"PII hits: {c.pii_hits}")
    for issue in r.errors:
        print(f"  error   {_where(issue)}[{issue.code}] {issue.message}")
    if r.error_count > len(r.errors):
        print(f"  ... and {r.error_count - len(r.errors)} more errors: {r.error_counts}")
    for issue in r.warnings[:20]:
        print(f"  warning {_where(issue)}[{issue.code}] {issue.message}")
    cheapest = r.cost_estimate.cheapest if r.cost_estimate else None
    if r.cost_estimate and cheapest:
        print(f"  cost: {r.cost_estimate.tokens_x_epochs} tokens over {r.cost_estimate.epochs} epochs; cheapest "
              f"{cheapest.method} on {cheapest.gpu_type}: {cheapest.gpu_hours} GPU-h, ${cheapest.spot_usd} spot / "
              f"${cheapest.on_demand_usd} on-demand")


def _where(issue: Issue) -> str:
    return f"line {issue.line}: " if issue.line else ""
