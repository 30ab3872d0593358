"""The environment lockfile: every installed package with its version, the platform's commit and
the container image digest (seed 000: "lockfile of every dep + commit hash")."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any


def platform_commit(start: Path | None = None) -> str | None:
    """WHETSTONE_GIT_COMMIT, else the checkout's HEAD read from .git (no git binary needed)."""
    if os.environ.get("WHETSTONE_GIT_COMMIT"):
        return os.environ["WHETSTONE_GIT_COMMIT"]
    here = (start or Path(__file__)).resolve()
    for parent in here.parents:
        head = parent / ".git" / "HEAD"
        if head.is_file():
            ref = head.read_text().strip()
            if not ref.startswith("ref: "):
                return ref
            name = ref[5:]
            loose = parent / ".git" / name
            if loose.is_file():
                return loose.read_text().strip()
            packed = parent / ".git" / "packed-refs"
            if packed.is_file():
                for line in packed.read_text().splitlines():
                    if line.endswith(" " + name):
                        return line.split(" ", 1)[0]
            return None
    return None


def capture_environment(source: str = "registry") -> dict[str, Any]:
    packages = {}
    for dist in metadata.distributions():
        name = dist.metadata.get("Name")
        if name:
            packages[name.lower()] = dist.version
    return {
        "source": source,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "platform_commit": platform_commit(),
        "image_digest": os.environ.get("WHETSTONE_IMAGE_DIGEST"),
        "packages": dict(sorted(packages.items())),
    }
