"""Ingest: a raw upload in S3 -> validated, content-addressed, immutable dataset version.

The upload is streamed once to local scratch (hashed on the way), run through the data
gate (`usecases/pipeline.DataGate`, the same one `whet datasets check` runs), and the raw bytes,
the cleaned train/validation files, the tokenized cache and the report are written under
`tenants/<tenant>/datasets/<dataset_id>/`. Identical bytes give the same id, and the
verdict for an id is final: a redelivery or a re-upload re-announces it. `usecases/submissions.py` only
queues an upload; `entrypoints/worker.py` runs `validate` on it outside any transaction.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from whetstone.contracts import (ContaminatedRow, CostEstimate, DatasetStats, DatasetStatus, DatasetSubmittedV1,
                                 DatasetValidatedV1, NearDuplicateCluster, Purpose, TokenBucket,
                                 ValidationIssue, dataset_id_for)
from whetstone.runtime.file_ids import FILE_ID_PREFIX, file_id_key, minted_for
from whetstone.runtime.s3 import ObjectStore, parse_uri, tenant_prefix
from whetstone.runtime.service import Runtime

from ..adapters.archives import SourceError
from ..adapters.files import disk_of
from ..adapters.formats import HubSource, check_name, hub_id, known_suffix, open_source, suffix_of
from ..adapters.tokenizer import BaseModelTokenizer, TokenizerUnavailable
from ..context import IngestContext
from ..domain.issues import Issue
from ..domain.report import GateReport
from ..domain.storage import Bound, write_budget
from .gates import GateRequest, archive_limits, make_gate, reference_index
from .pipeline import GateResult, Progress, TokenCounts

EVENT_LIST_LIMIT = 10


def reject(ev: DatasetSubmittedV1, version: str, code: str, message: str, line: int | None = None,
           **extra: Any) -> DatasetValidatedV1:
    return DatasetValidatedV1(dataset_id=ev.dataset_id, version=version, name=ev.name, status=DatasetStatus.REJECTED,
                              purpose=ev.purpose, errors=[ValidationIssue(code=code, message=message, line=line)],
                              error_count=1, **extra)


def _download(store: ObjectStore, uri: str, dest: Path, limit: int) -> tuple[str, int] | None:
    """Stream to `dest`, hashing; None when the object is over `limit` bytes."""
    h, size = hashlib.sha256(), 0
    with store.open_stream(uri) as body, open(dest, "wb") as out:
        for chunk in iter(lambda: body.read(1 << 20), b""):
            size += len(chunk)
            if size > limit:
                return None
            h.update(chunk)
            out.write(chunk)
    return h.hexdigest(), size


def _materialize_hub(ref: str, dest: Path) -> tuple[str, int]:
    """Stream a Hub dataset into a local JSONL file (its content address is this file's sha256)."""
    source = HubSource.open(ref)
    h, size = hashlib.sha256(), 0
    with open(dest, "wb") as out:
        for rec in source.records():
            if rec.issue is not None:
                raise SourceError(rec.issue.code, rec.issue.message)
            line = json.dumps(rec.row, ensure_ascii=False, default=str).encode() + b"\n"
            h.update(line)
            size += len(line)
            out.write(line)
    return h.hexdigest(), size


def _throttled_log(rt: Runtime[IngestContext], dataset_id: str) -> Progress:
    last = [0.0]

    def progress(phase: str, done: int, total: int | None) -> None:
        now = time.monotonic()
        if now - last[0] >= 5:
            last[0] = now
            rt.log.info("ingest progress", dataset_id=dataset_id, phase=phase, done=done, total=total)
    return progress


def _event_stats(report: GateReport, size: int, base_model: str | None) -> DatasetStats:
    """The report's figures for dataset.validated (lists capped; the full report is at report_uri)."""
    c, stats = report.counts, report.stats
    assert report.near_dup and report.contamination and report.pii and report.tokenization and stats
    return DatasetStats(
        train_rows=c.train_rows, validation_rows=c.validation_rows, exact_duplicates=c.exact_duplicates,
        near_duplicates=c.near_duplicates, contaminated=c.contaminated, pii_hits=c.pii_hits, toxic=c.toxic,
        size_bytes=size, output_schema=report.output_schema, tokens_estimated=report.tokens_estimated,
        layout=report.layout, layout_counts=report.layout_counts, role_mapping=report.role_mapping,
        ignored_keys=report.ignored_keys, error_counts=report.error_counts, warning_counts=report.warning_counts,
        tokens=stats.tokens, token_histogram=[TokenBucket.model_validate(asdict(b)) for b in stats.token_histogram],
        roles=stats.roles, turns=stats.turns, trained_tokens=stats.trained_tokens,
        near_dup_clusters=[NearDuplicateCluster.model_validate(asdict(k))
                           for k in report.near_dup.clusters[:EVENT_LIST_LIMIT]],
        contamination_examples=[ContaminatedRow.model_validate(asdict(e))
                                for e in report.contamination.examples[:EVENT_LIST_LIMIT]],
        references=report.contamination.references, pii_by_kind=report.pii.by_kind,
        tokenization=report.tokenization,
        timings=report.timings,
        # images of the rows written: the scheduler refuses a job whose base cannot see them
        images=report.images.images if report.images else 0,
        rows_with_images=report.images.rows_with_images if report.images else 0, base_model=base_model)


class TokenizedManifest(BaseModel):
    """manifest.json of a dataset version's tokenized rows (one tokenizer): written by `_store_tokenized`,
    read back by `_cached_token_counts`."""

    model_config = ConfigDict(extra="ignore")

    dataset_version: str
    tokenizer: str | None
    tokenizer_hash: str | None
    fingerprint: str | None          # what the per-row counts depend on (TokenCounts.applies_to)
    max_seq_len: int
    over_length_policy: str
    rows: int
    files: dict[str, str]            # side (train, validation) -> its JSONL file next to the manifest


def _cached_token_counts(store: ObjectStore, base: str, dest: Path) -> TokenCounts | None:
    """The per-row counts of an earlier tokenization of this dataset version with this tokenizer."""
    manifest_uri = store.uri(f"{base}/manifest.json")
    try:
        if not store.exists(manifest_uri):
            return None
        manifest = TokenizedManifest.model_validate_json(store.get_bytes(manifest_uri))
        if manifest.fingerprint is None:
            return None
        path = store.download_file(store.uri(f"{base}/lengths.tsv"), dest / "cached-lengths.tsv")
        return TokenCounts.read(path, manifest.fingerprint)
    except (ValueError, OSError):       # pydantic's ValidationError is a ValueError
        return None


def _store_tokenized(store: ObjectStore, base: str, version: str, result: GateResult) -> None:
    """Tokenized rows keyed by dataset version + tokenizer hash: written once, reused when they still apply."""
    tok = result.report.tokenization
    assert tok is not None
    if tok.cache == "reused":
        result.report.tokenization = tok.model_copy(update={"tokenized_uri": store.uri(base), "tokenized_cache": "hit"})
        return
    files: dict[str, str] = {}
    for side, path in sorted(result.tokenized_paths.items()):
        store.put_file(f"{base}/{side}.jsonl", path)
        files[side] = f"{side}.jsonl"
    assert result.lengths_path is not None
    store.put_file(f"{base}/lengths.tsv", result.lengths_path)
    manifest = TokenizedManifest(dataset_version=version, tokenizer=tok.tokenizer, tokenizer_hash=tok.tokenizer_hash,
                                 fingerprint=tok.fingerprint, max_seq_len=tok.max_seq_len,
                                 over_length_policy=tok.over_length_policy, rows=result.report.counts.rows_kept,
                                 files=files)
    store.put_bytes(f"{base}/manifest.json", json.dumps(manifest.model_dump(), indent=1).encode(), "application/json")
    result.report.tokenization = tok.model_copy(update={"tokenized_uri": store.uri(base), "tokenized_cache": "written"})


def id_names_upload(rt: Runtime[IngestContext], tenant_id: str, dataset_id: str, sha256: str) -> bool:
    """A dataset id is the content's address (`ds-`), or a file id the Files API minted for this tenant."""
    if dataset_id.startswith(FILE_ID_PREFIX):
        return minted_for(dataset_id, tenant_id, file_id_key(rt.settings.data_dir))
    return dataset_id_for(sha256) == dataset_id


def process_upload(rt: Runtime[IngestContext], tenant_id: str, ev: DatasetSubmittedV1) -> DatasetValidatedV1:
    """Blocking: download, gate, store. Runs in a worker thread."""
    store, ctx, cfg = rt.store, rt.ctx, rt.ctx.config
    prefix = f"{tenant_prefix(tenant_id)}datasets/{ev.dataset_id}"
    hub = hub_id(ev.source_uri) if ev.source_uri.startswith("hf://") else None
    with tempfile.TemporaryDirectory(prefix="ingest-", dir=cfg.work_dir) as tmp:
        tmpd = Path(tmp)
        name = ev.name if suffix_of(ev.name) else (Path(ev.source_uri).name if not hub else "hub.jsonl")
        raw_path = tmpd / "raw"
        if hub:
            try:
                version, size = _materialize_hub(hub, raw_path)
            except SourceError as exc:
                return reject(ev, "", exc.issue.code, exc.issue.message)
            name = "hub.jsonl"
        else:
            # the copy on this pod's disk: no larger than the upload limit or the disk's free space
            budget = write_budget(cfg.max_upload_bytes, disk_of(cfg.work_dir, cfg.disk_reserve_bytes))
            got = _download(store, ev.source_uri, raw_path, budget.bytes)
            if got is None:
                _, code, message = budget.refusal("the upload")
                return reject(ev, "", code, message if budget.bound is Bound.DISK
                              else f"upload exceeds {cfg.max_upload_bytes} bytes")
            version, size = got
            if not id_names_upload(rt, tenant_id, ev.dataset_id, version):
                return reject(ev, version, "dataset_id_mismatch",
                              f"dataset_id {ev.dataset_id} is neither the content's address "
                              f"({dataset_id_for(version)}) nor a file id of this tenant")
        if size == 0:
            return reject(ev, version, "empty_file", "the uploaded file is empty")
        raw_uri = store.put_file(f"{prefix}/raw{known_suffix(name)}", raw_path)
        report_uri = store.uri(f"{prefix}/report.json")

        def rejected(issue: Issue) -> DatasetValidatedV1:
            event = reject(ev, version, issue.code, issue.message, issue.line, raw_uri=raw_uri, report_uri=report_uri,
                           stats=DatasetStats(size_bytes=size))
            store.put_bytes(f"{prefix}/report.json", event.model_dump_json(indent=1).encode(), "application/json")
            return event

        try:
            source = open_source(raw_path, name=name, workdir=tmpd / "source", max_line_bytes=cfg.max_line_bytes,
                                 image_line_bytes=cfg.max_record_bytes,
                                 limits=archive_limits(cfg, disk_of(cfg.work_dir, cfg.disk_reserve_bytes)))
        except SourceError as exc:
            return rejected(exc.issue)
        tokenizer, tokenized_base, token_counts = None, None, None
        if ev.base_model:
            try:
                tokenizer = BaseModelTokenizer.load(ev.base_model, rt.settings.model_catalog)
            except TokenizerUnavailable as exc:
                return rejected(Issue("base_model_unavailable", str(exc)))
            tokenized_base = f"{prefix}/tokenized/{tokenizer.hash[:32]}"
            token_counts = _cached_token_counts(store, tokenized_base, tmpd)
        problems: list[Issue] = []
        references = reference_index(cfg, _tenant_references(store, tenant_id, tmpd / "refs"), problems,
                                     ctx.reference_cache)
        tier = rt.settings.tenants.get(tenant_id)
        request = GateRequest(tenant_id=tenant_id, tier=tier, purpose=ev.purpose, base_model=ev.base_model)
        gate = make_gate(cfg, request, tokenizer=tokenizer, references=references, toxicity=ctx.toxicity,
                         progress=_throttled_log(rt, ev.dataset_id), warnings=problems, token_counts=token_counts)
        try:
            result = gate.run(source, tmpd / "gate")
        except Exception as exc:  # a gate bug must reject this upload, not poison the partition
            rt.log.exception("data gate failed", dataset_id=ev.dataset_id)
            return rejected(Issue("processing_failed", f"the data gate failed on this upload "
                                  f"({type(exc).__name__}); the platform team has been alerted"))
        report = result.report
        uris: dict[str, str] = {}
        if result.accepted:
            if result.train_path:
                uris["train_uri"] = store.put_file(f"{prefix}/train.jsonl", result.train_path)
            if result.validation_path:
                uris["validation_uri"] = store.put_file(f"{prefix}/validation.jsonl", result.validation_path)
            if tokenized_base:
                _store_tokenized(store, tokenized_base, version, result)
        stats = _event_stats(report, size, ev.base_model)
        if report.tokenization and report.tokenization.tokenized_uri:
            stats = stats.model_copy(update={"tokenized_uri": report.tokenization.tokenized_uri,
                                             "tokenized_cache": report.tokenization.tokenized_cache})
        if result.audit_path.stat().st_size:
            stats = stats.model_copy(update={"audit_uri": store.put_file(f"{prefix}/audit.jsonl", result.audit_path)})
        c = report.counts
        event = DatasetValidatedV1(
            dataset_id=ev.dataset_id, version=version, name=ev.name, status=report.status,
            purpose=Purpose(report.purpose) if report.purpose else ev.purpose, format=report.format, data_schema=report.schema,
            rows_total=c.rows_total, rows_kept=c.rows_kept, tokens_total=report.tokens_total,
            errors=[ValidationIssue(**i.as_dict()) for i in report.errors], error_count=report.error_count,
            warnings=[ValidationIssue(**i.as_dict()) for i in report.warnings],
            stats=stats,
            policies={**report.policies, "split": f"hash:{cfg.validation_fraction}", "dedup": "exact+minhash"},
            raw_uri=raw_uri, report_uri=report_uri,
            cost_estimate=CostEstimate.model_validate(report.cost_estimate.as_dict()) if report.cost_estimate else None,
            **uris)
        full = {**report.as_dict(), "dataset_id": ev.dataset_id, "version": version, "name": ev.name,
                "size_bytes": size, "raw_uri": raw_uri, **uris}
        store.put_bytes(f"{prefix}/report.json", json.dumps(full, indent=1, default=str).encode(), "application/json")
        return event


def _tenant_references(store: ObjectStore, tenant_id: str, dest: Path) -> list[Path]:
    """A tenant's own eval sets, uploaded under tenants/<tenant>/references/."""
    paths = []
    for key in store.list_keys(f"{tenant_prefix(tenant_id)}references/"):
        name = key.rsplit("/", 1)[-1]
        if name and check_name(name) is None:
            paths.append(store.download_file(store.uri(key), dest / name))
    return paths


async def validate(rt: Runtime[IngestContext], tenant_id: str, ev: DatasetSubmittedV1) -> DatasetValidatedV1:
    """The verdict on one upload (the gate runs in a thread); no transaction may be open around it."""
    if tenant_id not in rt.settings.tenants:
        return reject(ev, "", "unknown_tenant", f"tenant {tenant_id!r} is not registered")
    bad_name = check_name(ev.name)
    if bad_name:
        return reject(ev, "", bad_name.code, bad_name.message)
    if not ev.source_uri.startswith("hf://"):
        try:
            bucket, key = parse_uri(ev.source_uri)
            outside = bucket != rt.store.bucket or not key.startswith(tenant_prefix(tenant_id)) or ".." in key
        except ValueError as exc:
            outside, bad = True, str(exc)
        else:
            bad = f"source_uri must be under s3://{rt.store.bucket}/{tenant_prefix(tenant_id)}"
        if outside:
            return reject(ev, "", "source_outside_tenant", bad)
        if not await asyncio.to_thread(rt.store.exists, ev.source_uri):
            return reject(ev, "", "source_missing", f"no object at {ev.source_uri}")
    return await asyncio.to_thread(process_upload, rt, tenant_id, ev)
