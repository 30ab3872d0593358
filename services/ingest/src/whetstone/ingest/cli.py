"""`whet datasets check FILE`: the same validation as the service, offline, no stack."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .domain.chat import run_validation


def check_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="whet datasets check")
    p.add_argument("file")
    p.add_argument("--json", action="store_true")
    p.add_argument("--min-examples", type=int, default=10)
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    path = Path(args.file)
    if not path.is_file():
        print(f"no such file: {path}", file=sys.stderr)
        return 2
    with open(path, "rb") as f:
        report = run_validation(f, lambda side, row: None, min_examples=args.min_examples)
    accepted = report.error_count == 0
    out = {"accepted": accepted, "format": "jsonl", "schema": "chat", "rows_total": report.rows_total,
           "rows_kept": report.rows_kept, "exact_duplicates": report.exact_duplicates,
           "errors": [i.as_dict() for i in report.errors], "error_count": report.error_count,
           "warnings": [i.as_dict() for i in report.warnings]}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{'ACCEPTED' if accepted else 'REJECTED'}: {report.rows_kept}/{report.rows_total} rows kept")
        for i in report.errors:
            print(f"  line {i.line}: [{i.code}] {i.message}")
        if report.error_count > len(report.errors):
            print(f"  ... and {report.error_count - len(report.errors)} more")
    return 0 if accepted else 1
