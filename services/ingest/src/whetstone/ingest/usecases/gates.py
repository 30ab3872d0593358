"""Wiring of a DataGate from settings, shared by the service handler and the offline CLI."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..adapters.archives import ArchiveLimits
from ..adapters.plugins import load_toxicity_classifier
from ..adapters.references import build_index, fetch_hub_benchmarks, reference_files
from ..adapters.tokenizer import BaseModelTokenizer, model_params
from ..config import IngestSettings
from ..domain.contamination import ReferenceIndex
from ..domain.issues import Issue
from ..domain.policies import PolicyOverrides
from ..domain.storage import Bound, Disk, write_budget
from ..domain.toxicity import ToxicityClassifier
from .pipeline import DataGate, GateConfig, Progress, TokenCounts


@dataclass
class GateRequest:
    tenant_id: str | None = None
    tier: str | None = None
    purpose: str | None = None
    base_model: str | None = None
    policy_overrides: PolicyOverrides | None = None
    extra_references: Sequence[Path] = ()
    epochs: int | None = None


def archive_limits(s: IngestSettings, disk: Disk | None = None) -> ArchiveLimits:
    """The unpack limits; with `disk` (the work directory's disk, measured now) an archive may unpack to
    no more than its free space less the reserve, refused as `insufficient_storage` when that is the bound."""
    if disk is None:
        return ArchiveLimits(max_bytes=s.max_unpacked_bytes, max_ratio=s.max_compression_ratio,
                             max_members=s.max_archive_members)
    budget = write_budget(s.max_unpacked_bytes, disk, limit_name="unpack limit")
    over = budget.refusal("the unpacked archive")
    return ArchiveLimits(max_bytes=budget.bytes, max_ratio=s.max_compression_ratio, max_members=s.max_archive_members,
                         over_disk=(over[1], over[2]) if budget.bound is Bound.DISK else None)


def reference_index(s: IngestSettings, extra: Sequence[Path] = (), problems: list[Issue] | None = None,
                    cache: dict[tuple[Any, ...], ReferenceIndex] | None = None) -> ReferenceIndex | None:
    """Benchmarks from the configured directories (and the Hub when enabled) plus `extra` files."""
    files = reference_files(s.reference_dirs)
    if s.hub_benchmarks:
        files += fetch_hub_benchmarks(s.benchmark_cache_dir or Path.home() / ".cache" / "whetstone" / "benchmarks",
                                      problems=problems)
    files += reference_files(extra)
    if not files:
        return None
    key = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    if cache is not None and key in cache:
        return cache[key]
    index = build_index(files, problems=problems)
    if cache is not None:
        cache.clear()  # one index at a time: they can be large
        cache[key] = index
    return index


def make_gate(s: IngestSettings, req: GateRequest, *, tokenizer: BaseModelTokenizer | None,
              references: ReferenceIndex | None, toxicity: ToxicityClassifier | None,
              progress: Progress | None = None, warnings: list[Issue] | None = None,
              token_counts: TokenCounts | None = None) -> DataGate:
    policies = s.policies_for(req.tenant_id or "").merged(req.policy_overrides)
    config = GateConfig(purpose=req.purpose, policies=policies, min_examples=s.min_examples,
                        max_examples=s.max_examples_for(req.tier), validation_fraction=s.validation_fraction,
                        max_line_bytes=s.max_line_bytes, batch_size=s.batch_size, epochs=req.epochs or s.default_epochs,
                        throughput=s.throughput_table, prices=s.gpu_prices, workers=s.workers,
                        images=s.image_limits)
    params = model_params(tokenizer.location) if tokenizer else (None, "default")
    return DataGate(config, tokenizer=tokenizer, references=references, toxicity=toxicity, model_params=params,
                    progress=progress, extra_warnings=warnings, token_counts=token_counts)


def toxicity_classifier(s: IngestSettings) -> ToxicityClassifier | None:
    return load_toxicity_classifier(s.toxicity_classifier)
