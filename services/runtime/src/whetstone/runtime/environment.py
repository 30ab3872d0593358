"""The environment lockfile of the process that calls it: every installed package with its version
(importlib.metadata), the Python and OS, the platform's commit and the container image digest.

The trainer child writes its own as `environment.lock.json` into a job's final artifact (the
environment the weights were made in); the registry records that one in the model's lineage and
falls back to its own only for an artifact that brings none. Standard library only."""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

LOCKFILE = "environment.lock.json"
COMMIT_ENV = "WHETSTONE_GIT_COMMIT"
# the image digest an operator's deployment passes in (e.g. from the pod's imageID); first one set wins
IMAGE_DIGEST_ENV = ("WHETSTONE_IMAGE_DIGEST", "IMAGE_DIGEST")
PLATFORM_DISTRIBUTIONS = ("whetstone-runtime", "whetstone-trainer-agent", "whetstone-contracts")


@dataclass(frozen=True)
class EnvironmentLock:
    source: str                      # which process captured it: trainer, registry, ...
    python: str
    platform: str
    platform_commit: str | None
    commit_source: str | None        # env | package:<name> | git
    image_digest: str | None
    packages: dict[str, str] = field(default_factory=dict)   # lower-cased name -> version, sorted

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write(self, directory: Path) -> Path:
        path = directory / LOCKFILE
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path


def _git_head(start: Path) -> str | None:
    """HEAD of the checkout `start` lies in, read from .git (no git binary needed)."""
    for parent in start.resolve().parents:
        head = parent / ".git" / "HEAD"
        if not head.is_file():
            continue
        ref = head.read_text().strip()
        if not ref.startswith("ref: "):
            return ref or None
        name = ref[5:]
        loose = parent / ".git" / name
        if loose.is_file():
            return loose.read_text().strip() or None
        packed = parent / ".git" / "packed-refs"
        if packed.is_file():
            for line in packed.read_text().splitlines():
                if line.endswith(" " + name):
                    return line.split(" ", 1)[0]
        return None
    return None


def _package_commit() -> tuple[str, str] | None:
    """The commit pip recorded for a platform package installed from git (direct_url.json's vcs_info)."""
    for name in PLATFORM_DISTRIBUTIONS:
        try:
            text = metadata.distribution(name).read_text("direct_url.json")
        except metadata.PackageNotFoundError:
            continue
        try:
            commit = json.loads(text or "{}").get("vcs_info", {}).get("commit_id")
        except (ValueError, AttributeError):
            continue
        if isinstance(commit, str) and commit:
            return commit, f"package:{name}"
    return None


def platform_commit(start: Path | None = None) -> tuple[str | None, str | None]:
    """(commit, where it came from): WHETSTONE_GIT_COMMIT, else a platform package's pip-recorded
    git commit, else the HEAD of the checkout this file lies in; (None, None) when none is known."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV], "env"
    if (found := _package_commit()) is not None:
        return found
    head = _git_head(start or Path(__file__))
    return (head, "git") if head else (None, None)


def image_digest() -> str | None:
    return next((os.environ[name] for name in IMAGE_DIGEST_ENV if os.environ.get(name)), None)


def capture_environment(source: str) -> EnvironmentLock:
    packages: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.name
        if name:
            packages[name.lower()] = dist.version
    commit, commit_source = platform_commit()
    return EnvironmentLock(source=source, python=sys.version.split()[0], platform=platform.platform(),
                           platform_commit=commit, commit_source=commit_source, image_digest=image_digest(),
                           packages=dict(sorted(packages.items())))
