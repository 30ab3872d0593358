"""`whet eval import-tasks DIR`: validate an lm-eval task directory and stage it for stage 1.

    python -m whetstone.eval.entrypoints.cli import-tasks DIR [--dest TASK_DIR]

DEST defaults to WHETSTONE_EVAL_TASK_DIR when set (else `<data dir>/eval-tasks`); point the eval
service at it with WHETSTONE_EVAL_TASK_DIR. Exit 2 with the offending file and field on bad input."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..adapters.benchmarks import TaskDirError, import_tasks


def default_dest() -> Path:
    if os.environ.get("WHETSTONE_EVAL_TASK_DIR"):
        return Path(os.environ["WHETSTONE_EVAL_TASK_DIR"])
    return Path(os.environ.get("WHETSTONE_DATA_DIR", ".whetstone")) / "eval-tasks"


def cmd_import_tasks(source: Path, dest: Path | None = None) -> int:
    dest = dest or default_dest()
    try:
        names = import_tasks(source, dest)
    except TaskDirError as exc:
        print(f"import-tasks: {exc}", file=sys.stderr)
        return 2
    print(f"imported {len(names)} task(s) into {dest}: {', '.join(names)}")
    print(f"use them with WHETSTONE_EVAL_TASK_DIR={dest.resolve()}")
    return 0


def add_subcommands(sub) -> None:
    """Hook for the `whet` CLI: `whet eval import-tasks DIR [--dest D]`."""
    imp = sub.add_parser("import-tasks", help="validate and stage lm-eval task YAMLs over local data")
    imp.add_argument("source", type=Path)
    imp.add_argument("--dest", type=Path, default=None, help="task directory to copy into (default: WHETSTONE_EVAL_TASK_DIR)")
    imp.set_defaults(fn=lambda a: cmd_import_tasks(a.source, a.dest))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="whetstone.eval.entrypoints.cli")
    add_subcommands(parser.add_subparsers(dest="action", required=True))
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    raise SystemExit(main())
