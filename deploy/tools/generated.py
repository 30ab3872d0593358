"""Shared by the generators in this folder: write the files, or (`--check`) say which are stale."""

from __future__ import annotations

from pathlib import Path


def write_or_check(files: dict[str, str], out: Path, tool: str, argv: list[str]) -> int:
    stale = []
    for name, text in files.items():
        path = out / name
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date (run deploy/tools/{tool}):", ", ".join(stale))
        return 1
    return 0
