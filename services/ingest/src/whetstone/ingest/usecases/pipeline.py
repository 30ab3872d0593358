"""The data gate: ONE pipeline, driven by the service handler and by `whet datasets check`.

    pass 1 (streaming, batches of `batch_size` rows)
        prepare: parse -> layout -> normalise -> PII scan -> digests,      (passes/prepare.py)
                 13-gram fractions, toxicity, MinHash bands (pure, per chunk; `workers` processes)
        rows: errors, PII policy, length, in file order                    (passes/rows.py)
        exact dedup -> contamination -> toxicity                           (passes/dedup.py, screen.py)
        MinHash bands + surviving rows in output form, to disk             (passes/store.py)
    near-duplicates                                                        (passes/dedup.py)
        band collisions -> candidate pairs -> exact Jaccard -> clusters
    pass 2 (streaming)                                                     (passes/write.py, tokenise.py)
        stored rows minus removed ones -> tokenise (over-length policy, loss-mask preview)
        -> statistics -> train/validation files
    report                                                                 (passes/summary.py)

What a finding does to its row (removed / flagged / rejected) is decided in one place,
`domain/actions.py`, applied by `passes/findings.py`.

Memory is bounded by the batch, not the file: per row the gate keeps 20 to 40 bytes in
memory (16 to 32 in the duplicate set, an origin byte, an LSH flag, 4 bytes of token
length); the band hashes and row offsets live on disk next to the stored rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..adapters.formats import Source
from ..domain.contamination import ReferenceIndex
from ..domain.cost import DEFAULT_PRICES, DEFAULT_THROUGHPUT
from ..domain.images import ImageLimits
from ..domain.issues import Issue
from ..domain.minhash import LshParams, MinHasher
from ..domain.policies import Policies
from ..domain.report import (
    ContaminationReport,
    GateReport,
    ImageReport,
    NearDupReport,
    PiiReport,
    ToxicityReport,
    tokenization_section,
)
from ..domain.rows import LayoutGate
from ..domain.text import in_validation_split
from ..domain.toxicity import ToxicityClassifier, WordlistToxicity
from .passes.dedup import ExactDedup, NearDedup
from .passes.findings import Findings
from .passes.prepare import PrepareContext, Preparer
from .passes.rows import Candidate, RowPass
from .passes.screen import Contamination, Toxicity
from .passes.store import CandidateStore
from .passes.summary import Limits, Sections, build_report
from .passes.tokenise import TokenCounts, Tokenise, TokenizerPort, token_fingerprint
from .passes.write import Written, write_outputs

__all__ = ["DataGate", "GateConfig", "GateResult", "Progress", "TokenCounts", "TokenizerPort", "token_fingerprint"]

Progress = Callable[[str, int, int | None], None]
DEFAULT_MAX_SEQ_LEN = 4096


@dataclass
class GateConfig:
    purpose: str | None = None                      # None: follow the detected schema
    policies: Policies = field(default_factory=Policies)
    min_examples: int = 10
    max_examples: int = 1_000_000
    validation_fraction: float = 0.1
    max_line_bytes: int = 8 * 1024**2
    batch_size: int = 512
    epochs: int = 3
    throughput: dict[str, dict[str, float]] = field(default_factory=lambda: DEFAULT_THROUGHPUT)
    prices: dict[str, dict[str, float]] = field(default_factory=lambda: DEFAULT_PRICES)
    max_listed: int = 100
    max_clusters_listed: int = 50
    workers: int = 1                # processes for the pure per-row work of pass 1 (1: this process only)
    chunk_rows: int = 1024          # records per chunk handed to a worker
    parallel_min_rows: int = 4096   # a pool is started only after this many records (small files stay serial)
    parallel_min_bytes: int = 1 << 20   # ... or at once for a file this large (or a source of min_rows rows)
    images: ImageLimits = field(default_factory=ImageLimits)


@dataclass
class GateResult:
    report: GateReport
    train_path: Path | None
    validation_path: Path | None
    tokenized_paths: dict[str, Path]
    audit_path: Path                   # one JSON line per row removed, flagged or rejected, with the reason
    lengths_path: Path | None = None   # line, tokens, longest, trained of every tokenized row

    @property
    def accepted(self) -> bool:
        return self.report.accepted


class DataGate:
    """Configured once (tokenizer, references, classifier); `run` validates one dataset."""

    def __init__(self, config: GateConfig, *, tokenizer: TokenizerPort | None = None,
                 references: ReferenceIndex | None = None, toxicity: ToxicityClassifier | None = None,
                 model_params: tuple[int | None, str] = (None, "default"), progress: Progress | None = None,
                 extra_warnings: list[Issue] | None = None, token_counts: TokenCounts | None = None) -> None:
        self.config, self.tokenizer, self.references = config, tokenizer, references
        self.token_counts = token_counts
        self.toxicity = toxicity if config.policies.toxicity != "off" else None
        self.model_params, self.progress = model_params, progress or (lambda phase, done, total: None)
        self.extra_warnings = extra_warnings or []

    def run(self, source: Source, workdir: Path) -> GateResult:
        workdir.mkdir(parents=True, exist_ok=True)
        cfg, pol, tok = self.config, self.config.policies, self.tokenizer
        started = time.perf_counter()
        lsh = LshParams.for_threshold(pol.near_dup_threshold)
        max_len = tok.max_seq_len(pol.max_seq_len) if tok else (pol.max_seq_len or DEFAULT_MAX_SEQ_LEN)
        sections = Sections(
            near_dup=NearDupReport(pol.near_dup_threshold, lsh.num_perm, lsh.bands, lsh.rows),
            contamination=ContaminationReport(pol.contamination_threshold,
                                              self.references.describe() if self.references else {}),
            pii=PiiReport(pol.pii),
            toxicity=ToxicityReport(pol.toxicity, getattr(self.toxicity, "name", None)),
            tokenization=tokenization_section(max_len, pol.over_length, tok.ref if tok else None,
                                              tok.hash if tok else None, token_fingerprint(
                                                  tok.hash, pol.pii, max_len, pol.over_length) if tok else None),
            images=ImageReport.for_limits(cfg.images))
        findings = Findings(pol, workdir / "audit.jsonl", cfg.max_listed)
        layouts = LayoutGate(purpose=cfg.purpose)
        rows = RowPass(layouts, findings, sections.pii, cfg.max_line_bytes, source, sections.images)
        exact = ExactDedup(findings)
        screens: list[Contamination | Toxicity] = []
        if self.references:
            screens.append(Contamination(self.references, findings, sections.contamination, cfg.max_listed))
        if self.toxicity is not None:
            screens.append(Toxicity(self.toxicity, findings, sections.toxicity, pol.toxicity_threshold))
        hasher = MinHasher(lsh) if pol.near_dup != "off" else None
        store = CandidateStore(workdir, hasher)
        builtin = self.toxicity if isinstance(self.toxicity, WordlistToxicity) else None
        preparer = Preparer(PrepareContext(pol.pii, cfg.max_line_bytes, self.references or None, builtin, hasher,
                                           keep_text=self.toxicity is not None and builtin is None,
                                           images=cfg.images),
                            layouts, workdir, workers=cfg.workers, chunk_rows=cfg.chunk_rows,
                            min_rows=cfg.parallel_min_rows)
        timings: dict[str, float] = {}
        try:
            # pass 1
            batch: list[Candidate] = []
            large = source.total is not None and source.total >= (
                cfg.parallel_min_rows if source.unit == "rows" else cfg.parallel_min_bytes)
            for prepared in preparer.run(source.records(), large=large):
                candidate = rows.take(prepared)
                if candidate is not None:
                    batch.append(candidate)
                    if len(batch) >= cfg.batch_size:
                        self._batch(batch, exact, screens, store, layouts, source)
                        batch = []
            self._batch(batch, exact, screens, store, layouts, source)
            store.close_writing()
            self.progress("validate", source.done, source.total)
            timings["pass1_s"] = time.perf_counter() - started
            # near-duplicates
            t = time.perf_counter()
            if store.hasher is not None and store.count >= 2:
                self.progress("near-duplicates", 0, None)
            near = NearDedup(lsh, findings, sections.near_dup, cfg.max_clusters_listed).run(store, preparer.map)
            timings["near_dup_s"] = time.perf_counter() - t
            # pass 2
            t = time.perf_counter()
            tokenise = None
            if tok is not None:
                cached = self.token_counts
                tokenization = sections.tokenization
                if cached is not None:
                    usable = cached.applies_to(tokenization.fingerprint or "", store.lines()[~near.drop])
                    tokenization = tokenization.model_copy(update={"cache": "reused" if usable else "stale"})
                    cached = cached if usable else None
                tokenise = Tokenise(tok, findings, tokenization, cached, workdir / "lengths.tsv")
            written = write_outputs(store, near.drop, workdir, tokenise, max_len, self.progress)
            if tokenise is not None:
                sections.tokenization = tokenise.section()
            _count_images(sections.images, written, tok)
            timings["pass2_s"] = time.perf_counter() - t
        finally:
            preparer.close()
            findings.close()
            store.close_writing()
            store.remove_files()
        limits = Limits(cfg.min_examples, cfg.max_examples, cfg.epochs, cfg.throughput, cfg.prices)
        report = build_report(source, layouts, findings, exact, near.clusters, written, sections, limits,
                              tokenized=tok is not None, tool_rows=rows.tool_rows, model_params=self.model_params,
                              extra_warnings=self.extra_warnings)
        timings["total_s"] = time.perf_counter() - started
        if preparer.usage:             # the worker processes, for capacity planning (and the benchmark)
            timings["workers_cpu_s"] = sum(u.cpu_s for u in preparer.usage.values())
            timings["workers_peak_rss_mb"] = max(u.peak_rss_mb for u in preparer.usage.values())
        report.timings = {k: round(v, 3) for k, v in timings.items()}
        report.timings["rows_per_s"] = round(findings.counts.rows_total / max(timings["total_s"], 1e-9), 1)
        return GateResult(report, written.train_path, written.validation_path,
                          written.tokenized_paths, findings.audit_path,
                          tokenise.lengths_path if tokenise is not None else None)

    def _batch(self, batch: list[Candidate], exact: ExactDedup, screens: list[Contamination | Toxicity],
               store: CandidateStore, layouts: LayoutGate, source: Source) -> None:
        """Exact dedup -> screens -> store, for one batch of candidate rows."""
        rows = exact.run(batch) if batch else batch
        for screen in screens:
            if rows:
                rows = screen.run(rows)
        if rows:
            store.append(rows, [self._side(p, layouts, source) for p in rows])
        self.progress("validate", source.done, source.total)

    def _side(self, p: Candidate, layouts: LayoutGate, source: Source) -> int:
        if layouts.purpose == "eval":
            return 1
        if source.has_validation:      # a validation set was given: no split of the training file
            return p.origin
        return 1 if in_validation_split(p.digest, self.config.validation_fraction) else 0


def _count_images(report: ImageReport | None, written: Written, tok: TokenizerPort | None) -> None:
    """The images of the rows written; with a vision base, its own image token count."""
    if report is None:
        return
    report.images, report.rows_with_images = written.images, written.image_rows
    per_image = getattr(tok, "image_seq_length", None) if tok is not None else None
    if per_image:
        report.image_tokens = written.images * per_image
        report.image_tokens_source = f"base model processor: {per_image} tokens per image"
