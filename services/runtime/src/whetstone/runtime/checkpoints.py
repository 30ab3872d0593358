"""Durable checkpoints in S3: files first, manifest (sha256 per file) last.

A checkpoint without a valid manifest does not exist."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from whetstone.contracts.artifacts import ArtifactManifest, ManifestFile

from .errors import FieldError
from .s3 import ObjectStore, is_missing, parse_uri, sha256_file

MANIFEST = "manifest.json"
# what a writer records about its artifact in manifest.json next to `files` (job, tenant, step ...)
ManifestMeta = Mapping[str, str | int | None]


class CorruptCheckpoint(Exception):
    pass


@dataclass(frozen=True)
class UploadedCheckpoint:
    uri: str
    manifest_sha256: str
    files: int
    size_bytes: int
    manifest: ArtifactManifest   # as written (its files' sha256 without reading it back)


def upload_checkpoint(store: ObjectStore, local: Path, prefix: str, meta: ManifestMeta) -> UploadedCheckpoint:
    """Upload every file under `local`, then manifest.json: `meta` (who wrote it: job, tenant,
    step ...) and each file's sha256 and size."""
    files: dict[str, ManifestFile] = {}
    total = 0
    for p in sorted(x for x in local.rglob("*") if x.is_file()):
        rel = p.relative_to(local).as_posix()
        if rel == MANIFEST:
            continue
        size = p.stat().st_size
        files[rel] = ManifestFile(sha256=sha256_file(p), size=size)
        store.put_file(f"{prefix}/{rel}", p)
        total += size
    written = ArtifactManifest.model_validate({**meta, "files": files})
    manifest = json.dumps(written.model_dump(mode="json", exclude_unset=True), sort_keys=True, indent=1).encode()
    store.put_bytes(f"{prefix}/{MANIFEST}", manifest, "application/json")
    return UploadedCheckpoint(store.uri(prefix), hashlib.sha256(manifest).hexdigest(), len(files), total, written)


def read_manifest(store: ObjectStore, uri: str, expected_sha256: str | None = None, *,
                  job_id: str | None = None) -> tuple[ArtifactManifest, str]:
    """A checkpoint's manifest and its sha256. CorruptCheckpoint when it is missing, differs from the
    pinned sha256, is unreadable, lists no files, or belongs to another job; a store that cannot be
    reached raises its own error (retry later, nothing is corrupt)."""
    bucket, prefix = parse_uri(uri.rstrip("/"))
    try:
        raw = store.get_bytes(f"s3://{bucket}/{prefix}/{MANIFEST}")
    except Exception as exc:
        if is_missing(exc):
            raise CorruptCheckpoint(f"{uri}: no manifest") from exc
        raise
    digest = hashlib.sha256(raw).hexdigest()
    if expected_sha256 and digest != expected_sha256:
        raise CorruptCheckpoint(f"{uri}: manifest sha256 mismatch ({digest[:12]}… is not the pinned {expected_sha256[:12]}…)")
    try:
        manifest = ArtifactManifest.model_validate_json(raw)
    except ValidationError as exc:
        first = FieldError.first_of(exc)
        raise CorruptCheckpoint(f"{uri}: unreadable manifest ({first.path or 'manifest'}: {first.message})") from exc
    if not manifest.files:
        raise CorruptCheckpoint(f"{uri}: manifest lists no files")
    if job_id is not None and manifest.job_id != job_id:
        raise CorruptCheckpoint(f"{uri}: manifest belongs to job {manifest.job_id!r}")
    return manifest, digest


def download_checkpoint(store: ObjectStore, uri: str, dest: Path, expected_manifest_sha256: str | None = None, *,
                        only: Iterable[str] | None = None, job_id: str | None = None,
                        manifest: ArtifactManifest | None = None) -> ArtifactManifest:
    """Download the checkpoint's files (or `only` those) into `dest`, each checked against the manifest
    (size and sha256), the manifest against its pinned sha256. CorruptCheckpoint on any doubt: a file
    missing from the manifest or the store, a name outside `dest`, a size or hash that differs.
    `manifest`: one already read with `read_manifest` (not read again)."""
    if manifest is None:
        manifest, _ = read_manifest(store, uri, expected_manifest_sha256, job_id=job_id)
    bucket, prefix = parse_uri(uri.rstrip("/"))
    files = manifest.files
    root = dest.resolve()
    for rel in (list(files) if only is None else list(only)):
        info = files.get(rel)
        if info is None:
            raise CorruptCheckpoint(f"{uri}: the manifest lists no {rel}")
        target = dest / rel
        if not target.resolve().is_relative_to(root):
            raise CorruptCheckpoint(f"{uri}: manifest names a file outside the checkpoint: {rel!r}")
        try:
            store.download_file(f"s3://{bucket}/{prefix}/{rel}", target)
        except Exception as exc:
            if is_missing(exc):
                raise CorruptCheckpoint(f"{uri}: {rel} is missing") from exc
            raise
        size = target.stat().st_size
        if (info.size is not None and size != info.size) or sha256_file(target) != info.sha256:
            raise CorruptCheckpoint(f"{uri}: {rel} does not match its sha256")
    return manifest
