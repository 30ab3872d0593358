"""Prepare pass: the pure per-row work of pass 1, a chunk of records at a time, in this process
or in a pool of worker processes (`Preparer`, `workers` > 1), results in input order.

Per record: parse -> layout/schema -> normalise -> PII scan (redaction when asked) -> the
row's payload, role counts, length estimate, normalized text and digest. Per chunk (numpy,
batched): the contamination fraction of every row, its toxicity score (built-in word list),
its MinHash band hashes. None of it depends on other rows, so a row's values are the same
whichever chunk or process computed them. What DOES depend on the order (findings, the
audit trail, exact duplicates, the file's schema, counts) stays in the calling process:
`rows.RowPass.take` applies a `Prepared` in order.

The file's schema is fixed by its first recognisable row: chunks are prepared in-process
until it is fixed; then workers read rows with a copy of the gate's schema and purpose and
send back what they learned (layout counts, ignored keys, role mappings), merged in chunk
order, so the report is the one a single process writes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import pickle
import resource
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ...adapters.images import check_images
from ...adapters.source import Record
from ...domain.chat import uses_tools
from ...domain.contamination import ReferenceIndex
from ...domain.images import ImageLimits, RowImages, openai_image_tokens
from ...domain.issues import Issue
from ...domain.layouts import MAX_IGNORED_KEYS, RowFacts
from ...domain.minhash import MinHasher
from ...domain.normal import ChatRow
from ...domain.rows import LayoutGate, apply_pii, parse_json_line, role_counts
from ...domain.schemas import text_messages
from ...domain.text import fingerprint
from ...domain.toxicity import WordlistToxicity

T = TypeVar("T")
CHUNK_BYTES = 16 * 1024 ** 2     # a chunk's input lines stay under about this many bytes
R = TypeVar("R")


@dataclass
class Candidate:
    """A row that passed the row checks, with everything the batch passes need."""

    line: int
    origin: int                # 0: the training file, 1: a validation file/split given with it
    payload: bytes             # the output row, JSON (the input line itself when nothing changed)
    text: str | None           # canonical text; kept only for a plugged-in toxicity classifier
    digest: bytes              # exact-duplicate digest
    roles: dict[str, int]
    estimate: int              # tokens estimated from characters
    contamination: tuple[float, str | None] | None = None   # (fraction of 13-grams in a reference set, set)
    toxicity: float | None = None
    bands: np.ndarray | None = None                          # MinHash band hashes
    shingles: int = 0
    images: RowImages | None = None                          # the row's images (None: a text-only row)


@dataclass
class Prepared:
    """One record prepared: the issues that stop it, or the PII found and the candidate row."""

    line: int
    issues: list[Issue] = field(default_factory=list)       # parse / layout issues: the row stops here
    pii: dict[str, int] | None = None                       # PII kinds found (before redaction)
    too_long: bool = False                                  # row text over max_line_bytes (checked after PII)
    tools: bool = False
    candidate: Candidate | None = None


@dataclass
class PrepareContext:
    """What preparing needs besides the records: picklable, sent once to each worker."""

    pii_policy: str
    max_line_bytes: int
    references: ReferenceIndex | None
    toxicity: WordlistToxicity | None        # only the built-in, pure classifier is run here
    hasher: MinHasher | None
    keep_text: bool                          # a plugged-in classifier scores the text later
    images: ImageLimits = field(default_factory=ImageLimits)


@dataclass
class LayoutDelta:
    """What a worker's LayoutGate learned from one chunk, merged into the gate's in chunk order."""

    layout_counts: dict[str, int]
    ambiguous: dict[str, int]
    ignored: dict[str, int]
    role_mapping: dict[str, dict[str, str]]


class _AllFacts(RowFacts):
    """RowFacts without the caps: the caps are applied when merged, in file order."""

    def ignore(self, key: str) -> None:
        self.ignored[key] = self.ignored.get(key, 0) + 1

    def mapped(self, layout: str, source: str, target: str) -> None:
        self.role_mapping.setdefault(layout, {}).setdefault(source, target)


def prepare_record(rec: Record, layouts: LayoutGate, ctx: PrepareContext) -> tuple[Prepared, tuple[str, str] | None]:
    """One record -> (Prepared, (normalized text, canonical text) of a candidate for the batch screens)."""
    if rec.issue is not None:
        return Prepared(rec.line, [rec.issue]), None
    row = rec.row
    if row is None:
        assert rec.raw is not None          # a record is a parsed row or a raw line
        row, issue = parse_json_line(rec.raw, rec.line)
        if issue is not None:
            return Prepared(rec.line, [issue]), None
    elif not isinstance(row, dict):
        return Prepared(rec.line, [Issue("row_not_object", "each row must be an object", rec.line)]), None
    read = layouts.read(row, rec.line)
    out = read.out
    if read.issues or out is None:
        return Prepared(rec.line, read.issues), None
    images = None
    if isinstance(out, ChatRow) and any(type(m["content"]) is list for m in out.messages):
        issues, images = check_images(out.messages, rec.line, ctx.images)
        if issues:
            return Prepared(rec.line, issues), None
    found = apply_pii(out, ctx.pii_policy)
    redacted = found.row
    messages = text_messages(redacted)
    text = "\n".join([m["content"] for m in messages])     # canonical_text(redacted)
    prepared = Prepared(rec.line, pii=found.counts or None)
    if len(text) > ctx.max_line_bytes:
        prepared.too_long = True
        return prepared, None
    prepared.tools = redacted.tools is not None or (isinstance(redacted, ChatRow) and uses_tools(redacted.messages))
    # the JSONL line itself is written when the row needed no change (the common case: no re-encoding)
    written = redacted.as_json()
    unchanged = redacted is out and written.keys() == row.keys() and all(written[k] is row[k] for k in written) \
        and not (images is not None and images.fetched)        # a fetched image's part now holds its data URL
    payload = rec.raw if rec.raw is not None and unchanged else json.dumps(
        written, ensure_ascii=False).encode("utf-8", "surrogatepass")
    roles = role_counts(redacted)
    norm, digest = fingerprint(messages)
    estimate = (len(text) + 3) // 4 + 4 * sum(roles.values())
    if images is not None:      # the same text with other images is another example
        digest = hashlib.sha256(digest + "".join(f.sha256 for f in images.facts).encode()).digest()
        estimate += sum(openai_image_tokens(f.width, f.height, d) for f, d in zip(images.facts, images.details))
    prepared.candidate = Candidate(rec.line, rec.origin, payload, text if ctx.keep_text else None, digest, roles,
                                   estimate, images=images)
    return prepared, (norm, text)


def prepare_chunk(records: Iterable[Record], layouts: LayoutGate, ctx: PrepareContext) -> list[Prepared]:
    """Prepare records, then screen and MinHash the candidates of the chunk in a few batched passes."""
    out: list[Prepared] = []
    rows: list[Candidate] = []
    norms: list[str] = []
    texts: list[str] = []
    for rec in records:
        prepared, screened = prepare_record(rec, layouts, ctx)
        out.append(prepared)
        if screened is not None and prepared.candidate is not None:
            rows.append(prepared.candidate)
            norms.append(screened[0])
            texts.append(screened[1])
    if not rows:
        return out
    words = None
    if ctx.references is not None:
        words = ctx.references.hasher.word_hashes(norms)      # shared with the toxicity word list
        fractions, names = ctx.references.match(norms, words)
        for p, fraction, name in zip(rows, fractions.tolist(), names):
            p.contamination = (fraction, name)
    if ctx.toxicity is not None:
        scores = ctx.toxicity.scores(texts) if words is None else ctx.toxicity.scores_with_words(texts, *words)
        for p, score in zip(rows, scores):
            p.toxicity = score
    if ctx.hasher is not None:
        sig, shingles = ctx.hasher.signatures(norms)
        bands = ctx.hasher.band_hashes(sig)
        for i, (p, n) in enumerate(zip(rows, shingles.tolist())):
            p.bands, p.shingles = bands[i], n
    return out


# ------------------------------------------------------------------------------ worker processes

log = logging.getLogger(__name__)
_WORKER_CTX: PrepareContext | None = None


def _init_worker(ctx_path: str) -> None:
    """The context (reference sets included: megabytes) is read from a file, not sent through the
    pipe that starts the process: a worker that dies while starting cannot block the gate."""
    global _WORKER_CTX
    with open(ctx_path, "rb") as f:
        _WORKER_CTX = pickle.load(f)   # written by the gate's own process just before


@dataclass
class WorkerUsage:
    """A worker's own resource use so far (its CPU time and peak RSS), sent back with each chunk: the
    workers are children of the fork server, so the gate cannot read it as its children's usage."""

    pid: int
    cpu_s: float
    peak_rss_mb: float

    @classmethod
    def now(cls) -> WorkerUsage:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return cls(os.getpid(), ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024)


# what a worker sends back for a chunk: the prepared rows packed, their band hashes, what the chunk taught
# the LayoutGate, the worker's resource use
ChunkResult = tuple[list[tuple[Any, ...]], np.ndarray | None, LayoutDelta, WorkerUsage]


def _prepare_in_worker(records: list[tuple[Any, ...]], purpose: str | None, schema: str | None,
                       schema_line: int | None) -> ChunkResult:
    """In a worker: records (as tuples: cheaper to pickle) -> prepared rows as tuples (`_pack`: without
    the payloads that are the input lines themselves), their band hashes as ONE array (not one small
    array per row), what the chunk taught the LayoutGate and the worker's resource use."""
    assert _WORKER_CTX is not None
    layouts = LayoutGate(purpose=purpose, schema=schema, schema_line=schema_line, facts=_AllFacts())
    chunk = [Record(*r) for r in records]
    prepared = prepare_chunk(chunk, layouts, _WORKER_CTX)
    bands = None
    if _WORKER_CTX.hasher is not None:
        rows = [p.candidate.bands for p in prepared if p.candidate is not None and p.candidate.bands is not None]
        bands = np.stack(rows) if rows else None
    packed = [_pack(p, rec.raw) for rec, p in zip(chunk, prepared)]
    return packed, bands, LayoutDelta(layouts.layout_counts, layouts.ambiguous, layouts.facts.ignored,
                                      layouts.facts.role_mapping), WorkerUsage.now()


def _pack(p: Prepared, raw: bytes | None) -> tuple[Any, ...]:
    """A prepared row as plain tuples (a third of the bytes, and about 3x faster to pickle and load
    than the dataclasses); a payload that IS the input line, which the gate already has, is left out,
    and so are the band hashes (one array per chunk)."""
    c = p.candidate
    if c is None:
        return p.line, p.issues, p.pii, p.too_long, p.tools, None
    return p.line, p.issues, p.pii, p.too_long, p.tools, (
        c.line, c.origin, b"" if c.payload is raw else c.payload, c.text, c.digest, c.roles, c.estimate,
        c.contamination, c.toxicity, c.shingles, c.images)


def _unpack(packed: tuple[Any, ...], raw: bytes | None, bands: np.ndarray | None) -> Prepared:
    line, issues, pii, too_long, tools, c = packed
    candidate = None
    if c is not None:
        candidate = Candidate(c[0], c[1], c[2] or raw or b"", c[3], c[4], c[5], c[6], c[7], c[8], bands, c[9], c[10])
    return Prepared(line, issues, pii, too_long, tools, candidate)


# imported once by the fork server: a worker started from a script (`whet`, the benchmark) imports the
# script again as `__mp_main__`, and the gate's wiring it imports (settings: pydantic) is then already
# loaded (it cost each worker about 0.3 s of CPU)
_PRELOAD = (__name__, f"{__package__.rpartition('.')[0]}.gates")


def _worker_context() -> multiprocessing.context.BaseContext:
    """Workers are forked from a fork server: a fresh process (no thread of the service is copied) that
    has imported this module and the gate's wiring, and that later pools reuse. A pool then starts in
    milliseconds; with "spawn" every worker imported the service's entry point again (a second or
    more of CPU)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(_PRELOAD))
    return ctx


def merge_layouts(layouts: LayoutGate, delta: LayoutDelta) -> None:
    """Fold a worker's chunk into the gate's LayoutGate as if the gate had read the rows itself."""
    for name, n in delta.layout_counts.items():
        layouts.layout_counts[name] = layouts.layout_counts.get(name, 0) + n
    for key, n in delta.ambiguous.items():
        layouts.ambiguous[key] = layouts.ambiguous.get(key, 0) + n
    ignored = layouts.facts.ignored
    for key, n in delta.ignored.items():
        if key in ignored or len(ignored) < MAX_IGNORED_KEYS:
            ignored[key] = ignored.get(key, 0) + n
    for layout, roles in delta.role_mapping.items():
        for source, target in roles.items():
            layouts.facts.mapped(layout, source, target)


class Preparer:
    """Prepared records in input order: chunks in this process, or in `workers` processes once the
    file's schema is fixed and `min_rows` records were read (small files never start a pool).
    At most 2 chunks per worker are in flight: memory stays bounded by the chunk size.

    A source known to be large (`run(..., large=True)`) starts its workers in a thread while this
    process prepares the first chunk (which fixes the schema), and hands them every chunk after it:
    no core is idle while the workers start (about half a second)."""

    def __init__(self, ctx: PrepareContext, layouts: LayoutGate, workdir: Path, *, workers: int = 1,
                 chunk_rows: int = 1024, min_rows: int = 4096) -> None:
        self.ctx, self.layouts, self.workers = ctx, layouts, workers
        self.ctx_path = workdir / "prepare-context.pkl"
        self.chunk_rows, self.min_rows = max(1, chunk_rows), min_rows
        self.pool: ProcessPoolExecutor | None = None
        self.usage: dict[int, WorkerUsage] = {}      # by worker pid: the latest report of each
        self._starting: threading.Thread | None = None
        self._start_error: BaseException | None = None

    def run(self, records: Iterable[Record], *, large: bool = False) -> Iterator[Prepared]:
        pending: deque[tuple[Future[ChunkResult], list[Record]]] = deque()
        seen = 0
        chunk: list[Record] = []
        if large and self.workers > 1:
            self.min_rows = 0
            self._starting = threading.Thread(target=self._start_in_background, name="ingest-pool-start",
                                              daemon=True)
            self._starting.start()
        try:
            size = 0
            for rec in records:
                chunk.append(rec)
                if rec.raw is not None:
                    size += len(rec.raw)
                # rows with images can be megabytes each: a chunk is also cut at CHUNK_BYTES
                if len(chunk) >= self.chunk_rows or size >= CHUNK_BYTES:
                    seen += len(chunk)
                    yield from self._chunk(chunk, pending, seen)
                    chunk, size = [], 0
            if chunk:
                yield from self._chunk(chunk, pending, seen + len(chunk))
            while pending:
                yield from self._collect(pending.popleft())
        finally:  # the pool stays for `map` until `close`
            for f, _ in pending:
                f.cancel()

    def _start_pool(self) -> ProcessPoolExecutor:
        with open(self.ctx_path, "wb") as f:
            pickle.dump(self.ctx, f, protocol=pickle.HIGHEST_PROTOCOL)
        return ProcessPoolExecutor(self.workers, mp_context=_worker_context(), initializer=_init_worker,
                                   initargs=(str(self.ctx_path),))

    def _start_in_background(self) -> None:
        try:
            pool = self._start_pool()
            for _ in range(self.workers):       # workers are started on demand: one per task in flight
                pool.submit(os.getpid)
            self.pool = pool
        except BaseException as exc:  # noqa: BLE001 - reported by the gate's thread, which goes on alone
            self._start_error = exc

    def _pool(self) -> ProcessPoolExecutor | None:
        if self._starting is not None:
            self._starting.join()
            self._starting = None
            if self._start_error is not None:
                log.warning("ingest worker pool did not start (%s); preparing in-process", self._start_error)
                self.workers = 1
        elif self.pool is None:
            self.pool = self._start_pool()
        return self.pool

    def _chunk(self, chunk: list[Record], pending: deque[tuple[Future[ChunkResult], list[Record]]], seen: int
               ) -> Iterator[Prepared]:
        layouts = self.layouts
        pool = None
        if self.workers > 1 and layouts.schema is not None and seen >= self.min_rows:
            pool = self._pool()
        if pool is None:
            while pending:                      # keep the order: earlier chunks first
                yield from self._collect(pending.popleft())
            yield from prepare_chunk(chunk, layouts, self.ctx)
            return
        records = [(r.line, r.origin, r.raw, r.row, r.issue) for r in chunk]
        try:
            future = pool.submit(_prepare_in_worker, records, layouts.purpose, layouts.schema, layouts.schema_line)
        except BrokenProcessPool:
            future = Future[ChunkResult]()
            future.set_exception(BrokenProcessPool("the pool is broken"))
        pending.append((future, chunk))
        while len(pending) > 2 * self.workers:
            yield from self._collect(pending.popleft())

    def _collect(self, item: tuple[Future[ChunkResult], list[Record]]) -> list[Prepared]:
        future, chunk = item
        try:
            prepared, bands, delta, usage = future.result()
        except BrokenProcessPool as exc:
            # a worker died (killed, out of memory, a main module that cannot be imported twice):
            # this chunk and the rest are prepared here, in order: the result does not change
            log.warning("ingest worker pool broken (%s); preparing in-process", exc)
            self.workers = 1
            return prepare_chunk(chunk, self.layouts, self.ctx)
        out: list[Prepared] = []
        row = 0
        for rec, packed in zip(chunk, prepared):
            p = _unpack(packed, rec.raw, None if bands is None or packed[5] is None else bands[row])
            row += p.candidate is not None
            out.append(p)
        merge_layouts(self.layouts, delta)
        self.usage[usage.pid] = usage
        return out

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """`fn` over `items`, in the workers when the pool runs (results in order), else here."""
        if self.pool is not None and self.workers > 1 and len(items) > 1:
            try:
                return list(self.pool.map(fn, items))
            except BrokenProcessPool as exc:
                log.warning("ingest worker pool broken (%s); working in-process", exc)
                self.workers = 1
        return [fn(x) for x in items]

    def close(self) -> None:
        if self._starting is not None:
            self._starting.join()
            self._starting = None
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
        self.ctx_path.unlink(missing_ok=True)
