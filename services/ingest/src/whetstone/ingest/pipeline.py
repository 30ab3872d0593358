"""The data gate: ONE pipeline, driven by the service handler and by `whet datasets check`.

    pass 1 (streaming, batches of `batch_size` rows)
        parse -> schema detection -> row validation -> PII (warn | redact | block)
        -> exact dedup (SHA-256 of the normalized text, a compact 64-bit key set)
        -> contamination (13-gram overlap with the reference sets) -> toxicity
        -> MinHash signatures -> LSH band hashes (to a file on disk)
        -> the surviving rows, already in output form, to a candidates file on disk
    near-duplicates
        band collisions -> candidate pairs -> exact Jaccard (rows re-read from the
        candidates file) -> clusters -> all but the earliest row of a cluster removed
    pass 2 (streaming)
        candidates minus removed rows -> tokenization with the base model's tokenizer
        (over-length policy, loss-mask preview) -> statistics -> train/validation files

Memory is bounded by the batch, not the file: per row the gate keeps 20 to 40 bytes in
memory (16 to 32 in the duplicate set, an origin byte, an LSH flag, 4 bytes of token
length); the band hashes and row offsets live on disk next to the candidates.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np

from .adapters.formats import Source
from .adapters.tokenizer import Tokenized
from .domain.contamination import ReferenceIndex, is_contaminated
from .domain.cost import DEFAULT_PRICES, DEFAULT_THROUGHPUT, estimate_cost
from .domain.hashing import HashSet64
from .domain.issues import Issue, IssueLog
from .domain.minhash import LshParams, MinHasher, candidate_pairs, clusters, shingle_set, verify_pairs
from .domain.policies import Policies
from .domain.rows import SchemaGate, apply_pii, parse_json_line, role_counts
from .domain.schemas import OUTPUT_SCHEMA, canonical_text, normalize_row, row_messages
from .domain.stats import DatasetStats
from .domain.text import digest_key, fingerprint, in_validation_split
from .domain.toxicity import ToxicityClassifier

Progress = Callable[[str, int, int | None], None]
ROLE_FIELDS = ("system", "user", "assistant", "text")
PREVIEWS = 3


class TokenizerPort(Protocol):
    ref: str
    hash: str

    def max_seq_len(self, policy_value: int | None) -> int: ...
    def tokenize(self, out: dict, max_len: int | None = None) -> Tokenized: ...
    def preview(self, out: dict) -> str: ...


@dataclass
class TokenCounts:
    """Per-row token counts of an earlier tokenization (the tokenized cache's `lengths.tsv`).

    Used instead of tokenizing again only when it covers exactly the rows about to be
    tokenized, in order, under the same tokenizer and length policy (`fingerprint`)."""

    fingerprint: str
    lines: np.ndarray
    tokens: np.ndarray
    longest: np.ndarray
    trained: np.ndarray

    @classmethod
    def read(cls, path: Path, fingerprint: str) -> TokenCounts:
        table = np.loadtxt(path, dtype=np.int64, delimiter="\t", ndmin=2)
        table = table.reshape(-1, 4)
        return cls(fingerprint, table[:, 0], table[:, 1], table[:, 2], table[:, 3])


def token_fingerprint(tokenizer_hash: str, pii: str, max_len: int, over_length: str) -> str:
    """What decides a row's token counts besides its line: the tokenizer, redaction, the length rule."""
    return hashlib.sha256(f"{tokenizer_hash}|pii={pii}|max_len={max_len}|over_length={over_length}".encode()
                          ).hexdigest()


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


@dataclass
class GateResult:
    report: dict[str, Any]
    train_path: Path | None
    validation_path: Path | None
    tokenized_paths: dict[str, Path]
    audit_path: Path | None = None     # one JSON line per row removed or flagged, with the reason
    lengths_path: Path | None = None   # line, tokens, longest, trained of every tokenized row

    @property
    def accepted(self) -> bool:
        return bool(self.report["accepted"])


@dataclass
class _Pending:
    line: int
    origin: int
    out: dict
    payload: bytes | None      # the raw JSONL line when it can be written as is
    text: str                  # canonical text (toxicity)
    norm: str                  # normalized text (near-duplicates, contamination)
    digest: bytes              # exact-duplicate digest


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
        return _GateRun(self, source, workdir).run()


class _GateRun:
    def __init__(self, gate: DataGate, source: Source, workdir: Path) -> None:
        self.gate, self.cfg, self.pol = gate, gate.config, gate.config.policies
        self.source, self.dir = source, workdir
        self.log = IssueLog(limit=self.cfg.max_listed)
        self.schema_gate = SchemaGate(purpose=self.cfg.purpose)
        self.lsh = LshParams.for_threshold(self.pol.near_dup_threshold)
        self.hasher = MinHasher(self.lsh)
        self.digests = (HashSet64(), HashSet64())          # per origin: training file, given validation
        self.pending: list[_Pending] = []
        self.counts = {"rows_total": 0, "exact_duplicates": 0, "near_duplicates": 0, "contaminated": 0,
                       "pii_hits": 0, "pii_rows": 0, "toxic": 0, "overlap": 0, "over_length": 0, "truncated": 0,
                       "over_length_dropped": 0}
        self.pii_by_kind: dict[str, int] = {}
        self.contamination_examples: list[dict[str, Any]] = []
        self.exact_examples: list[int] = []
        self.overlap_lines: set[int] = set()
        self.cluster_report: list[dict[str, Any]] = []
        self.timings: dict[str, float] = {}
        self.n_candidates = 0
        self.origins: list[np.ndarray] = []
        self.eligible: list[np.ndarray] = []
        self.candidates_path, self.bands_path, self.offsets_path = (workdir / "candidates.tsv",
                                                                     workdir / "bands.u64", workdir / "offsets.i64")
        self.lines_path = workdir / "lines.i64"
        self.audit_path = workdir / "audit.jsonl"
        self.audit_file: BinaryIO | None = None

    def _audit(self, line: int, action: str, reason: str, **detail: Any) -> None:
        assert self.audit_file is not None
        self.audit_file.write(json.dumps({"line": line, "action": action, "reason": reason, **detail}).encode() + b"\n")

    # ------------------------------------------------------------------ pass 1

    def run(self) -> GateResult:
        started = time.perf_counter()
        with open(self.audit_path, "wb") as self.audit_file:
            with open(self.candidates_path, "wb") as cand, open(self.bands_path, "wb") as bands, \
                    open(self.offsets_path, "wb") as offsets, open(self.lines_path, "wb") as lines:
                self.out_files = (cand, bands, offsets, lines)
                for rec in self.source.records():
                    self._take(rec)
                    if len(self.pending) >= self.cfg.batch_size:
                        self._flush()
                self._flush()
            self.gate.progress("validate", self.source.done, self.source.total)
            for issue in self.schema_gate.file_issues:
                self.log.add_error(issue)
            self.timings["pass1_s"] = time.perf_counter() - started
            t = time.perf_counter()
            drop = self._near_duplicates()
            self.timings["near_dup_s"] = time.perf_counter() - t
            t = time.perf_counter()
            result = self._write_outputs(drop)
            self.timings["pass2_s"] = time.perf_counter() - t
        result.audit_path = self.audit_path
        self.timings["total_s"] = time.perf_counter() - started
        for p in (self.candidates_path, self.bands_path, self.offsets_path, self.lines_path):
            p.unlink(missing_ok=True)
        result.report["timings"] = {k: round(v, 3) for k, v in self.timings.items()}
        rows = self.counts["rows_total"]
        result.report["timings"]["rows_per_s"] = round(rows / max(self.timings["total_s"], 1e-9), 1)
        return result

    def _take(self, rec) -> None:
        self.counts["rows_total"] += 1
        if rec.issue is not None:
            self.log.add_error(rec.issue)
            return
        row = rec.row
        if row is None:
            row, issue = parse_json_line(rec.raw, rec.line)
            if issue is not None:
                self.log.add_error(issue)
                return
        elif not isinstance(row, dict):
            self.log.error("row_not_object", "each row must be an object", rec.line)
            return
        schema, issues = self.schema_gate.check(row, rec.line)
        if issues:
            for issue in issues:
                self.log.add_error(issue)
            return
        out = normalize_row(row, schema)
        pii = apply_pii(out, self.pol.pii)
        if pii.counts:
            if not self._pii(pii.counts, rec.line):
                return
            out = pii.row
        text = canonical_text(out)
        if len(text) > self.cfg.max_line_bytes:
            self.log.error("line_too_long", f"row text is longer than {self.cfg.max_line_bytes} characters", rec.line)
            return
        passthrough = rec.raw if (rec.raw is not None and schema in ("chat", "text") and not pii.counts) else None
        norm, digest = fingerprint(row_messages(out))
        self.pending.append(_Pending(rec.line, rec.origin, out, passthrough, text, norm, digest))

    def _pii(self, found: dict[str, int], line: int) -> bool:
        """Count PII; False when the row is blocked."""
        hits = sum(found.values())
        self.counts["pii_hits"] += hits
        self.counts["pii_rows"] += 1
        for kind, n in found.items():
            self.pii_by_kind[kind] = self.pii_by_kind.get(kind, 0) + n
        kinds = ", ".join(f"{k} x{n}" for k, n in sorted(found.items()))
        self._audit(line, "removed" if self.pol.pii == "block" else "flagged", "pii", kinds=found,
                    redacted=self.pol.pii == "redact")
        if self.pol.pii == "block":
            self.log.error("pii_blocked", f"personal data found ({kinds}); PII policy is block", line)
            return False
        self.log.warn("pii", f"personal data found ({kinds}){'; redacted' if self.pol.pii == 'redact' else ''}", line)
        return True

    def _flush(self) -> None:
        batch, self.pending = self.pending, []
        if not batch:
            return
        fresh = self._exact_dedup(batch)
        kept = self._screen(fresh)
        if kept:
            self._write_candidates(kept)
        self.gate.progress("validate", self.source.done, self.source.total)

    def _exact_dedup(self, batch: list[_Pending]) -> list[_Pending]:
        first: dict[tuple[int, int], _Pending] = {}
        for p in batch:
            key = (p.origin, digest_key(p.digest))
            if key in first:
                self._exact_duplicate(p)
            else:
                first[key] = p
        fresh: list[_Pending] = []
        for origin in (0, 1):
            group = [p for (o, _), p in first.items() if o == origin]
            if not group:
                continue
            keys = np.array([digest_key(p.digest) for p in group], dtype=np.uint64)
            seen = self.digests[origin].contains(keys)
            self.digests[origin].add(keys[~seen])
            if origin == 1:
                overlap = self.digests[0].contains(keys)
                for p in (p for p, o in zip(group, overlap) if o):
                    self._overlap(p.line, "validation row duplicates a training row")
            for p, dup in zip(group, seen):
                if dup:
                    self._exact_duplicate(p)
                else:
                    fresh.append(p)
        fresh.sort(key=lambda p: p.line)
        return fresh

    def _overlap(self, line: int, message: str) -> None:
        if line not in self.overlap_lines:
            self.overlap_lines.add(line)
            self.counts["overlap"] += 1
            self.log.warn("train_validation_overlap", message, line)

    def _exact_duplicate(self, p: _Pending) -> None:
        self.counts["exact_duplicates"] += 1
        self._audit(p.line, "removed", "exact_duplicate")
        if len(self.exact_examples) < 20:
            self.exact_examples.append(p.line)

    def _screen(self, rows: list[_Pending]) -> list[_Pending]:
        """Contamination and toxicity; returns the rows that stay."""
        if not rows:
            return rows
        drop = np.zeros(len(rows), dtype=bool)
        refs = self.gate.references
        if refs:
            fractions, names = refs.match([p.norm for p in rows])
            for i in np.flatnonzero(fractions > self.pol.contamination_threshold):
                self._contaminated(rows[i], float(fractions[i]), names[i])
                drop[i] = self.pol.contamination == "remove"
        classifier = self.gate.toxicity
        if classifier is not None:
            scores = classifier.scores([p.text for p in rows])
            for i, score in enumerate(scores):
                if score >= self.pol.toxicity_threshold:
                    self.counts["toxic"] += 1
                    self._audit(rows[i].line, "flagged" if self.pol.toxicity == "flag" else "removed", "toxicity",
                                score=round(float(score), 3), classifier=classifier.name)
                    if self.pol.toxicity == "block":
                        self.log.error("toxic_blocked", f"toxicity score {score:.2f} ({classifier.name})", rows[i].line)
                    else:
                        self.log.warn("toxicity", f"toxicity score {score:.2f} ({classifier.name})"
                                      f"{'; removed' if self.pol.toxicity == 'remove' else ''}", rows[i].line)
                    drop[i] |= self.pol.toxicity in ("remove", "block")
        return [p for p, d in zip(rows, drop) if not d]

    def _contaminated(self, p: _Pending, fraction: float, name: str | None) -> None:
        assert is_contaminated(fraction, self.pol.contamination_threshold)
        self.counts["contaminated"] += 1
        action = "removed" if self.pol.contamination == "remove" else "flagged"
        self._audit(p.line, action, "contamination", fraction=round(fraction, 4), reference=name)
        self.log.warn("contamination", f"{fraction:.0%} of the row's 13-grams occur in reference set {name!r}; {action}",
                      p.line)
        if len(self.contamination_examples) < self.cfg.max_listed:
            self.contamination_examples.append({"line": p.line, "fraction": round(fraction, 3), "reference": name})

    def _side(self, p: _Pending) -> int:
        if self.schema_gate.purpose == "eval":
            return 1
        if self.source.has_validation:      # a validation set was given: no split of the training file
            return p.origin
        return 1 if in_validation_split(p.digest, self.cfg.validation_fraction) else 0

    def _write_candidates(self, rows: list[_Pending]) -> None:
        cand, bands_file, offsets_file, lines_file = self.out_files
        if self.pol.near_dup != "off":
            sig, shingles = self.hasher.signatures([p.norm for p in rows])
            bands_file.write(self.hasher.band_hashes(sig).tobytes())
            self.eligible.append(shingles > 0)
        offsets = np.empty(len(rows), dtype=np.int64)
        pos = cand.tell()
        for i, p in enumerate(rows):
            offsets[i] = pos
            roles = role_counts(p.out)
            est = (len(p.text) + 3) // 4 + 4 * sum(roles.values())
            head = b"%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t" % (p.line, p.origin, self._side(p), est,
                                                           *(roles.get(r, 0) for r in ROLE_FIELDS))
            payload = p.payload if p.payload is not None else json.dumps(p.out, ensure_ascii=False).encode(
                "utf-8", "surrogatepass")
            record = head + payload + b"\n"
            cand.write(record)
            pos += len(record)
        offsets_file.write(offsets.tobytes())
        lines_file.write(np.array([p.line for p in rows], dtype=np.int64).tobytes())
        self.origins.append(np.array([p.origin for p in rows], dtype=np.int8))
        self.n_candidates += len(rows)

    # ---------------------------------------------------------- near-duplicates

    def _near_duplicates(self) -> np.ndarray:
        n = self.n_candidates
        drop = np.zeros(n, dtype=bool)
        if self.pol.near_dup == "off" or n < 2:
            return drop
        self.gate.progress("near-duplicates", 0, None)
        bands = np.memmap(self.bands_path, dtype=np.uint64, mode="r", shape=(n, self.lsh.bands))
        offsets = np.fromfile(self.offsets_path, dtype=np.int64)
        pairs = candidate_pairs((np.array(bands[:, b]) for b in range(self.lsh.bands)), np.concatenate(self.eligible))
        del bands
        with open(self.candidates_path, "rb") as f:
            def read(i: int) -> list[bytes]:
                f.seek(int(offsets[i]))
                return f.readline().split(b"\t", 8)

            def shingles_of(i: int) -> np.ndarray:
                return shingle_set(fingerprint(row_messages(json.loads(read(i)[8])))[0])

            edges, scores = verify_pairs(pairs, shingles_of, self.pol.near_dup_threshold)
            origin = np.concatenate(self.origins)
            same = origin[edges[:, 0]] == origin[edges[:, 1]]
            for a, b in edges[~same].tolist():
                train, val = (a, b) if origin[a] == 0 else (b, a)
                self._overlap(int(read(val)[0]), f"validation row is a near-duplicate of training line "
                              f"{int(read(train)[0])}")
            self.counts["candidate_pairs"] = int(len(pairs))
            groups = clusters(edges[same])
            partner = _best_partner(edges[same], scores[same])
            action = "removed" if self.pol.near_dup == "remove" else "flagged"
            for members in groups:
                self.counts["near_duplicates"] += len(members) - 1
                if self.pol.near_dup == "remove":
                    drop[members[1:]] = True
                for i in members[1:]:
                    score, other = partner[i]
                    self._audit(int(read(i)[0]), action, "near_duplicate", duplicate_of=int(read(other)[0]),
                                jaccard=round(score, 4), cluster_kept_line=int(read(members[0])[0]))
            self._report_clusters(groups[: self.cfg.max_clusters_listed], edges[same], scores[same], read)
        if self.counts["near_duplicates"]:
            action = "removed" if self.pol.near_dup == "remove" else "flagged"
            self.log.warn("near_duplicates", f"{self.counts['near_duplicates']} near-duplicate row(s) (Jaccard >= "
                          f"{self.pol.near_dup_threshold}) in {len(groups)} cluster(s); {action}")
        return drop

    def _report_clusters(self, listed: list[list[int]], edges: np.ndarray, scores: np.ndarray,
                         read: Callable[[int], list[bytes]]) -> None:
        where = {node: k for k, members in enumerate(listed) for node in members}
        best = [0.0] * len(listed)
        for (a, _), score in zip(edges.tolist(), scores.tolist()):
            k = where.get(a)
            if k is not None:
                best[k] = max(best[k], score)
        for k, members in enumerate(listed):
            lines = [int(read(i)[0]) for i in members[:10]]
            self.cluster_report.append({"kept_line": lines[0], "duplicate_lines": lines[1:], "size": len(members),
                                        "max_jaccard": round(best[k], 4)})

    # ------------------------------------------------------------------ pass 2

    def _cached_counts(self, drop: np.ndarray, max_len: int) -> TokenCounts | None:
        """The earlier counts when they are for exactly these rows (else None: tokenize)."""
        tok, cached = self.gate.tokenizer, self.gate.token_counts
        if tok is None or cached is None:
            return None
        lines = np.fromfile(self.lines_path, dtype=np.int64)[~drop] if self.n_candidates else np.zeros(0, np.int64)
        same = cached.fingerprint == token_fingerprint(tok.hash, self.pol.pii, max_len, self.pol.over_length)
        return cached if same and np.array_equal(cached.lines, lines) else None

    def _write_outputs(self, drop: np.ndarray) -> GateResult:
        tok = self.gate.tokenizer
        max_len = tok.max_seq_len(self.pol.max_seq_len) if tok else (self.pol.max_seq_len or 4096)
        cached = self._cached_counts(drop, max_len)
        self.token_cache_state = None if not tok or not self.gate.token_counts else ("reused" if cached else "stale")
        paths = {0: self.dir / "train.jsonl", 1: self.dir / "validation.jsonl"}
        tok_paths = {0: self.dir / "tokenized-train.jsonl", 1: self.dir / "tokenized-validation.jsonl"}
        stats = DatasetStats()
        side_rows, side_tokens = [0, 0], [0, 0]
        previews: list[dict[str, Any]] = []
        est_over = 0
        files: dict[int, BinaryIO] = {s: open(p, "wb") for s, p in paths.items()}
        tok_files: dict[int, BinaryIO] = {s: open(p, "wb") for s, p in tok_paths.items()} if tok and not cached else {}
        lengths = open(self.dir / "lengths.tsv", "wb") if tok else None
        try:
            with open(self.candidates_path, "rb") as cand:
                k = -1
                for i, record in enumerate(cand):
                    if drop[i]:
                        continue
                    k += 1
                    parts = record.split(b"\t", 8)
                    line, side, est = int(parts[0]), int(parts[2]), int(parts[3])
                    payload = parts[8].rstrip(b"\n")
                    roles = {r: int(parts[4 + j]) for j, r in enumerate(ROLE_FIELDS) if int(parts[4 + j])}
                    trained = 0
                    if tok:
                        counts = (int(cached.tokens[k]), int(cached.longest[k]), int(cached.trained[k])) \
                            if cached else None
                        got = self._tokenize(tok, payload, line, max_len, previews, counts, lengths)
                        if got is None:
                            continue
                        tokens, trained, tok_record = got
                        if tok_record is not None:
                            tok_files[side].write(json.dumps({"line": line, **tok_record}).encode() + b"\n")
                    else:
                        tokens = est
                        est_over += est > max_len
                    stats.add(tokens, roles, trained)
                    side_rows[side] += 1
                    side_tokens[side] += tokens
                    files[side].write(payload + b"\n")
                    if (side_rows[0] + side_rows[1]) % 4096 == 0:
                        self.gate.progress("write", i, self.n_candidates)
        finally:
            for f in (*files.values(), *tok_files.values(), *([lengths] if lengths else [])):
                f.close()
        self.gate.progress("write", self.n_candidates, self.n_candidates)
        result = self._finish(stats, side_rows, side_tokens, previews, est_over, max_len, paths,
                              tok_paths if tok_files else {})
        if tok:
            result.lengths_path = self.dir / "lengths.tsv"
        return result

    def _tokenize(self, tok: TokenizerPort, payload: bytes, line: int, max_len: int,
                  previews: list[dict[str, Any]], counts: tuple[int, int, int] | None,
                  lengths: BinaryIO) -> tuple[int, int, dict | None] | None:
        """(tokens, trained tokens, tokenized record or None when the counts came from the cache);
        None when the row is dropped or rejected."""
        out = None if counts else json.loads(payload)
        try:
            if counts:
                (tokens, longest, trained), record = counts, None
            else:
                t = tok.tokenize(out)
                tokens, longest, trained, record = t.tokens, t.longest, t.trained, t.record
            if longest > max_len:
                self.counts["over_length"] += 1
                self._audit(line, "flagged" if self.pol.over_length == "truncate" else "removed", "over_length",
                            tokens=longest, max_seq_len=max_len, policy=self.pol.over_length)
                if self.pol.over_length == "reject":
                    self.log.error("too_long", f"{longest} tokens > max_seq_len {max_len}", line)
                    return None
                if self.pol.over_length == "drop":
                    self.counts["over_length_dropped"] += 1
                    self.log.warn("over_length_dropped", f"{longest} tokens > max_seq_len {max_len}; dropped", line)
                    lengths.write(b"%d\t%d\t%d\t%d\n" % (line, tokens, longest, trained))
                    return None
                self.counts["truncated"] += 1
                if not counts:
                    t = tok.tokenize(out, max_len)
                    tokens, trained, record = t.tokens, t.trained, t.record
            if len(previews) < PREVIEWS:
                previews.append({"line": line, "rendered": tok.preview(out or json.loads(payload))[:4000]})
        except Exception as exc:  # the template's own errors (jinja, ChatFormatError, ...)
            self.log.error("template_error", f"the chat template cannot render this row: {type(exc).__name__}: "
                           f"{str(exc)[:200]}", line)
            return None
        lengths.write(b"%d\t%d\t%d\t%d\n" % (line, tokens, longest, trained))
        return tokens, trained, record

    # ------------------------------------------------------------------ report

    def _finish(self, stats: DatasetStats, side_rows: list[int], side_tokens: list[int],
                previews: list[dict[str, Any]], est_over: int, max_len: int, paths: dict[int, Path],
                tok_paths: dict[int, Path]) -> GateResult:
        cfg, c, log = self.cfg, self.counts, self.log
        kept = side_rows[0] + side_rows[1]
        purpose = self.schema_gate.purpose or cfg.purpose or "sft"
        if c["rows_total"] == 0:
            log.error("empty_file", "the file holds no rows")
        if kept < cfg.min_examples:
            log.error("too_few_examples", f"{kept} usable examples; at least {cfg.min_examples} are required")
        if kept > cfg.max_examples:
            log.error("too_many_examples", f"{kept} examples; this tier allows {cfg.max_examples}")
        self._summary_warnings(stats, side_rows, est_over, max_len, purpose)
        tok = self.gate.tokenizer
        params, params_source = self.gate.model_params
        train_tokens = side_tokens[0] if purpose != "eval" else 0
        cost = estimate_cost(train_tokens, cfg.epochs, purpose, params, throughput=cfg.throughput, prices=cfg.prices,
                             tokens_estimated=tok is None, params_source=params_source) if purpose != "eval" else None
        accepted = log.error_count == 0
        schema = self.schema_gate.schema
        report: dict[str, Any] = {
            "accepted": accepted, "status": "accepted" if accepted else "rejected",
            "format": self.source.format, "schema": schema, "purpose": purpose,
            "output_schema": OUTPUT_SCHEMA.get(schema or "", None),
            "rows_total": c["rows_total"], "rows_kept": kept, "train_rows": side_rows[0],
            "validation_rows": side_rows[1], "exact_duplicates": c["exact_duplicates"],
            "near_duplicates": c["near_duplicates"], "contaminated": c["contaminated"], "pii_hits": c["pii_hits"],
            "toxic": c["toxic"], "tokens_total": stats.tokens_total, "tokens_estimated": tok is None,
            "error_count": log.error_count, "errors": [i.as_dict() for i in log.errors],
            "error_counts": dict(sorted(log.error_counts.items())),
            "warnings": [i.as_dict() for i in log.warnings], "warning_counts": dict(sorted(log.warning_counts.items())),
            "policies": self.pol.as_strings(),
            "exact_duplicate_lines": self.exact_examples,
            "near_dup": {"threshold": self.pol.near_dup_threshold, "shingle": "char 5-grams",
                         "num_perm": self.lsh.num_perm, "bands": self.lsh.bands, "rows": self.lsh.rows,
                         "candidate_pairs": c.get("candidate_pairs", 0), "clusters": self.cluster_report},
            "contamination": {"threshold": self.pol.contamination_threshold, "ngram": 13,
                              "references": self.gate.references.describe() if self.gate.references else {},
                              "examples": self.contamination_examples},
            "pii": {"policy": self.pol.pii, "rows": c["pii_rows"], "by_kind": dict(sorted(self.pii_by_kind.items()))},
            "toxicity": {"policy": self.pol.toxicity, "classifier": getattr(self.gate.toxicity, "name", None),
                         "flagged": c["toxic"]},
            "tokenization": {"tokenizer": tok.ref if tok else None, "tokenizer_hash": tok.hash if tok else None,
                             "fingerprint": token_fingerprint(tok.hash, self.pol.pii, max_len, self.pol.over_length)
                             if tok else None, "cache": getattr(self, "token_cache_state", None),
                             "max_seq_len": max_len, "over_length_policy": self.pol.over_length,
                             "over_length": c["over_length"], "truncated": c["truncated"],
                             "dropped": c["over_length_dropped"], "mask_preview": previews},
            "stats": stats.summary(),
            "cost_estimate": cost,
        }
        if schema in ("prompt_completion", "instruction"):
            report["notes"] = [f"{schema} rows are written as chat conversations (user -> assistant)"]
        elif schema == "preference":
            report["notes"] = ["preference rows are written as {prompt, chosen, rejected} message lists"]
        train = paths[0] if side_rows[0] else None
        validation = paths[1] if side_rows[1] else None
        tokenized = {("train" if s == 0 else "validation"): p for s, p in tok_paths.items() if side_rows[s]}
        return GateResult(report, train, validation, tokenized)

    def _summary_warnings(self, stats: DatasetStats, side_rows: list[int], est_over: int, max_len: int,
                          purpose: str) -> None:
        log, c = self.log, self.counts
        for note in [*self.source.notes, *self.gate.extra_warnings]:
            log.warn(note.code, note.message, note.line, note.field)
        if self.source.blank_lines:
            log.warn("blank_lines", f"{self.source.blank_lines} blank line(s) skipped")
        if c["exact_duplicates"]:
            lines = ", ".join(map(str, self.exact_examples[:10]))
            log.warn("exact_duplicates", f"{c['exact_duplicates']} exact duplicate row(s) removed (lines {lines}"
                     f"{', ...' if c['exact_duplicates'] > 10 else ''})")
        if c["truncated"]:
            log.warn("truncated", f"{c['truncated']} row(s) longer than {max_len} tokens will be truncated")
        if self.gate.tokenizer is None and side_rows[0] + side_rows[1]:
            log.warn("tokens_estimated", "no base model given: token counts and cost are estimates "
                     "(characters / 4); pass the base model for exact counts")
            if est_over:
                log.warn("may_exceed_context", f"about {est_over} row(s) may exceed {max_len} tokens")
        outliers = stats.outliers()
        if outliers:
            log.warn("length_outliers", f"{outliers} row(s) are over 8x the median length")
        if purpose != "eval" and side_rows[0] and not side_rows[1]:
            log.warn("no_validation_rows", "no rows fell into the validation split; upload a validation set "
                     "for a meaningful eval")


def _best_partner(edges: np.ndarray, scores: np.ndarray) -> dict[int, tuple[float, int]]:
    """For every node of the near-duplicate graph: its most similar neighbour (Jaccard, node)."""
    best: dict[int, tuple[float, int]] = {}
    for (a, b), score in zip(edges.tolist(), scores.tolist()):
        if score > best.get(a, (-1.0, 0))[0]:
            best[a] = (score, b)
        if score > best.get(b, (-1.0, 0))[0]:
            best[b] = (score, a)
    return best
