"""Checkpoints of a job in the object store: upload (manifest last), verify, list, prune, resume.

A checkpoint exists only once its manifest (sha256 of every file) is stored and every
file matches it. Deleting removes the manifest FIRST, so a half-deleted checkpoint is
never mistaken for a durable one."""

from __future__ import annotations

import itertools
import shutil
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from whetstone.contracts import CheckpointRef
from whetstone.contracts.artifacts import ArtifactManifest
from whetstone.runtime.checkpoints import (
    MANIFEST,
    CorruptCheckpoint,
    ManifestMeta,
    UploadedCheckpoint,
    download_checkpoint,
    read_manifest,
    upload_checkpoint,
)
from whetstone.runtime.delivery import is_transient
from whetstone.runtime.s3 import ObjectStore, parse_uri

from ..domain.checkpoints import (
    AttemptFence,
    StaleAttempt,
    StoredCheckpoint,
    checkpoint_ref,
    checkpoints_in,
    job_checkpoints_prefix,
    parse_checkpoint,
    resume_candidates,
    to_prune,
)
from .processes import snapshot


class FenceRecord(BaseModel):
    """The job's fence.json: the newest attempt that started a segment."""

    attempt: int


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a segment actually resumes from (None: from scratch) and what was skipped."""

    path: Path | None
    uri: str | None = None
    step: int = 0
    manifest_sha256: str | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)   # (uri, why)

    def ref(self) -> CheckpointRef | None:
        if self.uri is None or self.manifest_sha256 is None:
            return None
        return CheckpointRef(uri=self.uri, step=self.step, manifest_sha256=self.manifest_sha256)

    @property
    def prefix(self) -> str | None:
        """The object key prefix resumed from (never pruned while the segment runs)."""
        return parse_uri(self.uri)[1] if self.uri else None


class S3Checkpoints:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    # -- fencing

    def fenced_attempt(self, fence: AttemptFence) -> int | None:
        """The newest attempt that started a segment of the job, None before any did."""
        uri = self.store.uri(fence.key)
        if not self.store.exists(uri):
            return None
        try:
            return FenceRecord.model_validate_json(self.store.get_bytes(uri)).attempt
        except ValidationError:
            return None

    def claim(self, fence: AttemptFence) -> None:
        """A segment starts: its attempt takes the job's checkpoints over (older attempts are refused
        from now on); StaleAttempt when a newer attempt did already."""
        fenced = self.fenced_attempt(fence)
        fence.check(fenced)
        if fenced != fence.attempt:
            self.store.put_bytes(fence.key, FenceRecord(attempt=fence.attempt).model_dump_json().encode())

    def check(self, fence: AttemptFence) -> None:
        fence.check(self.fenced_attempt(fence))

    # -- write

    def upload(self, local: Path, prefix: str, meta: ManifestMeta) -> UploadedCheckpoint:
        return upload_checkpoint(self.store, local, prefix, meta)

    def upload_snapshot(self, local: Path, staged: Path, prefix: str, meta: ManifestMeta, *, fence: AttemptFence,
                        attempts: int, outage_budget_s: float = 0.0,
                        on_retry: Callable[[int, Exception], None] = lambda attempt, exc: None,
                        ) -> UploadedCheckpoint:
        """Upload a hard-linked snapshot of `local` (the trainer may rotate its own checkpoints
        meanwhile), retried with backoff: an S3 hiccup boto3 gave up on, or the directory vanished.
        `attempts` bounds the tries; while S3 is unreachable (a restart, a network cut) tries go on
        beyond them for up to `outage_budget_s`. A stale attempt is refused before the upload, and its
        upload is removed again when a newer attempt took over meanwhile (StaleAttempt either way)."""
        began = time.monotonic()
        for attempt in itertools.count(1):
            uploaded = None
            try:
                self.check(fence)  # StaleAttempt: nothing written
                uploaded = self.upload(snapshot(local, staged), prefix, meta)
                self.check(fence)
                return uploaded
            except StaleAttempt:
                if uploaded is not None:  # a newer attempt took over while this one uploaded
                    self.delete_prefix(prefix)
                raise
            except Exception as exc:
                outage = is_transient(exc) and time.monotonic() - began < outage_budget_s
                if attempt >= attempts and not outage:
                    raise
                on_retry(attempt, exc)
                time.sleep(min(0.5 * 2 ** attempt, 10.0))
        raise AssertionError("unreachable")

    def delete(self, ck: StoredCheckpoint) -> None:
        self.delete_prefix(ck.prefix)

    def delete_prefix(self, prefix: str) -> None:
        prefix = prefix.rstrip("/")
        self.store.delete(self.store.uri(f"{prefix}/{MANIFEST}"))  # manifest first: the checkpoint stops existing
        for key in list(self.store.list_keys(prefix + "/")):
            self.store.delete(self.store.uri(key))

    def prune(self, tenant_id: str, job_id: str, keep_last: int, protected: Collection[str],
              fence: AttemptFence | None = None) -> list[str]:
        """Delete resumable checkpoints beyond the newest `keep_last`; returns the deleted prefixes.
        Call only after the newest checkpoint's manifest is stored; never for a stale attempt."""
        if fence is not None:
            self.check(fence)
        doomed = to_prune(self.list_job(tenant_id, job_id), keep_last, protected)
        for ck in doomed:
            self.delete(ck)
        return [ck.prefix for ck in doomed]

    # -- read

    def list_job(self, tenant_id: str, job_id: str) -> list[StoredCheckpoint]:
        prefix = job_checkpoints_prefix(tenant_id, job_id)
        return checkpoints_in(self.store.list_keys(prefix), prefix)

    def fetch_verified(self, prefix: str, dest: Path, *, expected_manifest_sha256: str | None = None,
                       job_id: str | None = None) -> tuple[ArtifactManifest, str]:
        """Download a checkpoint into an empty `dest` and check every file against the manifest (the
        runtime's one verified download). CorruptCheckpoint when the manifest is missing, altered, of
        another job, names a file outside the checkpoint, or a file differs."""
        uri = self.store.uri(prefix)
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        manifest, digest = read_manifest(self.store, uri, expected_manifest_sha256, job_id=job_id)
        download_checkpoint(self.store, uri, dest, manifest=manifest)
        return manifest, digest

    def resume_point(self, tenant_id: str, job_id: str, requested: CheckpointRef | Mapping[str, Any] | None,
                     dest: Path) -> ResumePoint:
        """The requested checkpoint if it verifies, else the newest older one that does; from
        scratch (path None) when none does. Store errors other than corruption propagate."""
        requested = checkpoint_ref(requested)
        if requested is None:
            return ResumePoint(None)
        _, key = parse_uri(requested.uri)
        key = key.rstrip("/")
        listed = self.list_job(tenant_id, job_id)
        wanted = parse_checkpoint(key)
        if wanted is not None and all(c.prefix != key for c in listed):
            listed.append(wanted)  # not listed at all: try it anyway, the fetch says why it fails
        skipped: list[tuple[str, str]] = []
        for ck in resume_candidates(listed, key, max_step=requested.step or None):
            pinned = requested.manifest_sha256 if ck.prefix == key else None
            try:
                _, digest = self.fetch_verified(ck.prefix, dest, expected_manifest_sha256=pinned, job_id=job_id)
            except CorruptCheckpoint as exc:
                skipped.append((self.store.uri(ck.prefix), str(exc)))
                continue
            return ResumePoint(dest, self.store.uri(ck.prefix), ck.step, digest, skipped)
        shutil.rmtree(dest, ignore_errors=True)
        return ResumePoint(None, skipped=skipped)
