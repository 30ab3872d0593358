"""Ingest: a raw upload in S3 -> validated, content-addressed, immutable dataset version."""

from __future__ import annotations

import asyncio
import hashlib
import json
import tempfile
from pathlib import Path

from whetstone.contracts import DatasetSubmittedV1, DatasetValidatedV1, Envelope, ValidationIssue, dataset_id_for
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.s3 import ObjectStore, parse_uri, tenant_prefix
from whetstone.runtime.service import Runtime

from .config import IngestSettings
from .domain.chat import Issue, Report, run_validation


def reject(ev: DatasetSubmittedV1, version: str, code: str, message: str) -> DatasetValidatedV1:
    return DatasetValidatedV1(dataset_id=ev.dataset_id, version=version, name=ev.name, status="rejected",
                              purpose=ev.purpose, errors=[ValidationIssue(code=code, message=message)], error_count=1)


def process_upload(store: ObjectStore, tenant_id: str, ev: DatasetSubmittedV1, cfg: IngestSettings) -> DatasetValidatedV1:
    """Stream the upload once: hash it, validate line by line, write raw/train/validation/report
    under tenants/<tenant>/datasets/<dataset_id>/. Bounded memory (one line at a time)."""
    with tempfile.TemporaryDirectory(prefix="ingest-") as tmp:
        tmpd = Path(tmp)
        raw_path = tmpd / "raw.jsonl"
        h = hashlib.sha256()
        size = 0
        with store.open_stream(ev.source_uri) as body, open(raw_path, "wb") as out:
            for chunk in iter(lambda: body.read(1 << 20), b""):
                size += len(chunk)
                if size > cfg.max_upload_bytes:
                    return reject(ev, "", "file_too_large", f"upload exceeds {cfg.max_upload_bytes} bytes")
                h.update(chunk)
                out.write(chunk)
        version = h.hexdigest()
        if size == 0:
            return reject(ev, version, "empty_file", "the uploaded file is empty")
        if dataset_id_for(version) != ev.dataset_id:
            return reject(ev, version, "dataset_id_mismatch",
                          f"dataset_id {ev.dataset_id} does not match the content ({dataset_id_for(version)})")
        files = {"train": open(tmpd / "train.jsonl", "wb"), "validation": open(tmpd / "validation.jsonl", "wb")}
        try:
            with open(raw_path, "rb") as lines:
                report: Report = run_validation(
                    lines, lambda side, row: files[side].write(json.dumps(row, ensure_ascii=False).encode() + b"\n"),
                    min_examples=cfg.min_examples, max_examples=cfg.max_examples,
                    validation_fraction=cfg.validation_fraction)
        finally:
            for f in files.values():
                f.close()
        accepted = report.error_count == 0
        if accepted and report.validation_rows == 0:
            report.warnings.append(Issue("no_validation_rows", "no rows fell into the validation split; "
                                         "upload a validation file for a meaningful eval"))
        prefix = f"{tenant_prefix(tenant_id)}datasets/{ev.dataset_id}"
        stats = {"turns": report.turns, "chars_total": report.chars_total, "train_rows": report.train_rows,
                 "validation_rows": report.validation_rows, "exact_duplicates": report.exact_duplicates,
                 "error_counts": report.error_counts, "size_bytes": size}
        uris = {"raw_uri": store.put_file(f"{prefix}/raw.jsonl", raw_path)}
        if accepted:
            uris["train_uri"] = store.put_file(f"{prefix}/train.jsonl", tmpd / "train.jsonl")
            if report.validation_rows:
                uris["validation_uri"] = store.put_file(f"{prefix}/validation.jsonl", tmpd / "validation.jsonl")
        event = DatasetValidatedV1(
            dataset_id=ev.dataset_id, version=version, name=ev.name, status="accepted" if accepted else "rejected",
            purpose=ev.purpose, format="jsonl", data_schema="chat", rows_total=report.rows_total,
            rows_kept=report.rows_kept, error_count=report.error_count,
            errors=[ValidationIssue(**i.as_dict()) for i in report.errors],
            warnings=[ValidationIssue(**i.as_dict()) for i in report.warnings], stats=stats,
            policies={"dedup": "exact", "split": f"hash:{cfg.validation_fraction}"},
            report_uri=store.uri(f"{prefix}/report.json"), **uris)
        store.put_bytes(f"{prefix}/report.json", event.model_dump_json(indent=1).encode(), "application/json")
        return event


async def on_dataset_submitted(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: DatasetSubmittedV1) -> None:
    cfg: IngestSettings = rt.state["config"]
    existing = await uow.conn.fetchrow("SELECT validated FROM dataset_versions WHERE tenant_id = $1 AND dataset_id = $2",
                                       env.tenant_id, ev.dataset_id)
    if existing:  # immutable: the same content was validated before; announce the same verdict again
        await uow.publish(DatasetValidatedV1.model_validate(existing["validated"]), tenant_id=env.tenant_id)
        return
    if env.tenant_id not in rt.settings.tenants:
        event = reject(ev, "", "unknown_tenant", f"tenant {env.tenant_id!r} is not registered")
    else:
        try:
            bucket, key = parse_uri(ev.source_uri)
            outside = bucket != rt.store.bucket or not key.startswith(tenant_prefix(env.tenant_id))
        except ValueError as exc:
            outside, bad = True, str(exc)
        else:
            bad = f"source_uri must be under s3://{rt.store.bucket}/{tenant_prefix(env.tenant_id)}"
        if outside:
            event = reject(ev, "", "source_outside_tenant", bad)
        elif not await asyncio.to_thread(rt.store.exists, ev.source_uri):
            event = reject(ev, "", "source_missing", f"no object at {ev.source_uri}")
        else:
            event = await asyncio.to_thread(process_upload, rt.store, env.tenant_id, ev, cfg)
    if event.version:  # only content-addressed verdicts are remembered
        await uow.conn.execute(
            "INSERT INTO dataset_versions (tenant_id, dataset_id, version, name, status, report_uri, validated)"
            " VALUES ($1,$2,$3,$4,$5,$6,$7) ON CONFLICT DO NOTHING",
            env.tenant_id, ev.dataset_id, event.version, ev.name, event.status, event.report_uri,
            event.model_dump(mode="json"))
    rt.log.info("dataset validated", dataset_id=ev.dataset_id, status=event.status, rows=event.rows_kept,
                errors=event.error_count)
    await uow.publish(event, tenant_id=env.tenant_id)
