"""Durable checkpoints in S3: files first, manifest (sha256 per file) last.

A checkpoint without a valid manifest does not exist."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .s3 import ObjectStore, parse_uri, sha256_file

MANIFEST = "manifest.json"


class CorruptCheckpoint(Exception):
    pass


@dataclass(frozen=True)
class UploadedCheckpoint:
    uri: str
    manifest_sha256: str
    files: int
    size_bytes: int


def upload_checkpoint(store: ObjectStore, local: Path, prefix: str, meta: dict) -> UploadedCheckpoint:
    files = {}
    total = 0
    for p in sorted(x for x in local.rglob("*") if x.is_file()):
        rel = p.relative_to(local).as_posix()
        if rel == MANIFEST:
            continue
        size = p.stat().st_size
        files[rel] = {"sha256": sha256_file(p), "size": size}
        store.put_file(f"{prefix}/{rel}", p)
        total += size
    manifest = json.dumps({**meta, "files": files}, sort_keys=True, indent=1).encode()
    store.put_bytes(f"{prefix}/{MANIFEST}", manifest, "application/json")
    return UploadedCheckpoint(store.uri(prefix), hashlib.sha256(manifest).hexdigest(), len(files), total)


def download_checkpoint(store: ObjectStore, uri: str, dest: Path, expected_manifest_sha256: str | None = None) -> dict:
    """Download and verify every file against the manifest; CorruptCheckpoint otherwise."""
    bucket, prefix = parse_uri(uri)
    try:
        raw = store.get_bytes(f"s3://{bucket}/{prefix}/{MANIFEST}")
    except Exception as exc:
        raise CorruptCheckpoint(f"{uri}: no manifest ({exc})") from exc
    if expected_manifest_sha256 and hashlib.sha256(raw).hexdigest() != expected_manifest_sha256:
        raise CorruptCheckpoint(f"{uri}: manifest sha256 mismatch")
    manifest = json.loads(raw)
    for rel, info in manifest["files"].items():
        target = dest / rel
        store.download_file(f"s3://{bucket}/{prefix}/{rel}", target)
        if sha256_file(target) != info["sha256"]:
            raise CorruptCheckpoint(f"{uri}: {rel} does not match its sha256")
    return manifest
