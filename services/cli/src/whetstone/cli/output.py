"""What the public-API commands share: timestamps, `--json` or text, list options and list objects."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from .api_objects import ListItem
from .client import Api, dumps


def when(ts: object) -> str:
    """A Unix timestamp as UTC `YYYY-mm-dd HH:MM:SS`; `-` for anything else."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S") if isinstance(ts, (int, float)) else "-"


def print_result(args: argparse.Namespace, raw: object, text: str) -> None:
    """The API's JSON as it answered with `--json`, else the readable text."""
    print(dumps(raw) if args.json else text)


def add_list_options(parser: argparse.ArgumentParser, items: str) -> argparse.ArgumentParser:
    """`--limit` (a page of 20 by default) and `--all` (every page) of a list command."""
    parser.add_argument("--limit", type=int, default=20, help=f"{items} per page (default 20)")
    parser.add_argument("--all", action="store_true", help="every page")
    return parser


def list_object(api: Api, path: str, limit: int, everything: bool, **params: Any) -> dict:
    """The API's list object; with `everything`, every page gathered into one (`has_more` false)."""
    if not everything:
        return api.get(path, limit=limit, **params)
    data = list(api.pages(path, limit=min(limit, 100), **params))
    ids = [ListItem.from_api(item).id for item in data]
    return {"object": "list", "data": data, "has_more": False,
            "first_id": ids[0] if ids else None, "last_id": ids[-1] if ids else None}
