"""The data gate's report: typed, and serialised in ONE place (`GateReport.as_dict`). Pure.

The service writes `as_dict()` as report.json and builds dataset.validated from the typed
fields; `whet datasets check --json` prints `as_dict()`. JSON keys (stable):

    status, accepted, format, schema, layout, layout_counts, role_mapping, ignored_keys, purpose,
    output_schema, rows_total, rows_kept, train_rows, validation_rows, exact_duplicates,
    near_duplicates, contaminated, pii_hits, toxic, tokens_total, tokens_estimated,
    error_count, errors[{code, message, line, field}], error_counts, warnings[...], warning_counts,
    policies, exact_duplicate_lines, near_dup{...}, contamination{...}, pii{...}, toxicity{...},
    tokenization{...}, images{...} (null for a file without images), stats{...}, cost_estimate, notes,
    timings (+ file when given)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from whetstone.contracts import DatasetStatus
from whetstone.contracts.dataset_stats import TokenizationSummary

from .cost import CostEstimate
from .images import CONVERTED_MODES, ImageLimits, RowImages, openai_image_tokens
from .issues import Issue, IssueLog
from .schemas import OUTPUT_SCHEMA
from .stats import StatsSummary


@dataclass
class RowCounts:
    rows_total: int = 0
    rows_kept: int = 0
    train_rows: int = 0
    validation_rows: int = 0
    exact_duplicates: int = 0
    near_duplicates: int = 0
    contaminated: int = 0
    pii_hits: int = 0
    toxic: int = 0


@dataclass(frozen=True)
class DuplicateCluster:
    """A listed near-duplicate cluster: the line kept and (the first of) the lines removed as its copies."""
    kept_line: int
    duplicate_lines: list[int]
    size: int
    max_jaccard: float


@dataclass(frozen=True)
class ContaminatedExample:
    """A listed row found in a reference set: the fraction of its 13-grams there, and which set."""
    line: int
    fraction: float
    reference: str | None


@dataclass
class NearDupReport:
    threshold: float
    num_perm: int
    bands: int
    rows: int
    candidate_pairs: int = 0
    clusters: list[DuplicateCluster] = field(default_factory=list)
    shingle: str = "char 5-grams"


@dataclass
class ContaminationReport:
    threshold: float
    references: dict[str, dict[str, int]] = field(default_factory=dict)
    examples: list[ContaminatedExample] = field(default_factory=list)
    ngram: int = 13


@dataclass
class PiiReport:
    policy: str
    rows: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)


@dataclass
class ToxicityReport:
    policy: str
    classifier: str | None = None
    flagged: int = 0


def tokenization_section(max_seq_len: int, over_length_policy: str, tokenizer: str | None = None,
                         tokenizer_hash: str | None = None, fingerprint: str | None = None) -> TokenizationSummary:
    """The report's tokenization section before any row is tokenized. Every field is given, so the
    report and dataset.validated write each key, null or zero until the tokenize pass fills it."""
    return TokenizationSummary(max_seq_len=max_seq_len, over_length_policy=over_length_policy, tokenizer=tokenizer,
                               tokenizer_hash=tokenizer_hash, fingerprint=fingerprint, cache=None, over_length=0,
                               truncated=0, dropped=0, mask_preview=[], tokenized_uri=None, tokenized_cache=None)


IMAGE_ISSUES = frozenset({"image_role", "image_part_invalid", "image_detail_invalid", "image_url_refused",
                          "image_bad_base64", "image_too_large", "image_format_unsupported",
                          "image_media_type_mismatch", "image_too_many_pixels", "image_mode_unsupported",
                          "image_undecodable", "too_many_images", "too_many_image_examples",
                          "images_unsupported_by_base"})
NEAR_DUP_IMAGE_BITS = "dHash, 64 bits (Pillow); image rows are near duplicates when their text is and every image " \
    "pair differs in at most (1 - threshold) x 64 bits"


@dataclass
class ImageReport:
    """Images of the file: read (rows that passed the row checks), written, refused."""

    max_bytes: int
    max_pixels: int
    max_per_example: int
    max_examples: int
    images: int = 0                     # images in the rows written (after duplicates were removed)
    rows_with_images: int = 0           # rows written that hold an image
    images_read: int = 0                # images of the rows that passed the row checks
    rows_read: int = 0
    images_refused: int = 0             # image issues that refused a row
    by_format: dict[str, int] = field(default_factory=dict)
    by_mode: dict[str, int] = field(default_factory=dict)
    by_detail: dict[str, int] = field(default_factory=dict)
    converted: int = 0                  # grey/palette images converted to RGB(A) at training time
    bytes_total: int = 0
    largest_pixels: int = 0
    image_tokens: int = 0               # in the rows read; with a vision base: in the rows written
    image_tokens_source: str = "estimate: OpenAI's GPT-4o tile formula (85 + 170 per 512-px tile; low: 85)"
    near_dup_hash: str = NEAR_DUP_IMAGE_BITS

    @classmethod
    def for_limits(cls, limits: ImageLimits) -> ImageReport:
        return cls(limits.max_bytes, limits.max_pixels, limits.max_per_example, limits.max_examples)

    def read(self, row: RowImages) -> None:
        self.rows_read += 1
        self.images_read += row.count
        for f, detail in zip(row.facts, row.details):
            self.by_format[f.format] = self.by_format.get(f.format, 0) + 1
            self.by_mode[f.mode] = self.by_mode.get(f.mode, 0) + 1
            self.by_detail[detail] = self.by_detail.get(detail, 0) + 1
            self.converted += f.mode in CONVERTED_MODES
            self.bytes_total += f.nbytes
            self.largest_pixels = max(self.largest_pixels, f.width * f.height)
            self.image_tokens += openai_image_tokens(f.width, f.height, detail)

    @property
    def seen(self) -> bool:
        return bool(self.images_read or self.images_refused)


@dataclass
class GateReport:
    status: DatasetStatus
    format: str | None = None
    schema: str | None = None
    layout: str | None = None
    layout_counts: dict[str, int] = field(default_factory=dict)
    role_mapping: dict[str, dict[str, str]] = field(default_factory=dict)
    ignored_keys: dict[str, int] = field(default_factory=dict)
    purpose: str | None = None
    counts: RowCounts = field(default_factory=RowCounts)
    tokens_total: int = 0
    tokens_estimated: bool = True
    errors: list[Issue] = field(default_factory=list)
    error_counts: dict[str, int] = field(default_factory=dict)
    warnings: list[Issue] = field(default_factory=list)
    warning_counts: dict[str, int] = field(default_factory=dict)
    policies: dict[str, str] = field(default_factory=dict)
    exact_duplicate_lines: list[int] = field(default_factory=list)
    near_dup: NearDupReport | None = None
    contamination: ContaminationReport | None = None
    pii: PiiReport | None = None
    toxicity: ToxicityReport | None = None
    tokenization: TokenizationSummary | None = None
    images: ImageReport | None = None
    stats: StatsSummary | None = None                      # DatasetStats.summary(); None: no row was read
    cost_estimate: CostEstimate | None = None
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    file: str | None = None

    @property
    def accepted(self) -> bool:
        return self.status == DatasetStatus.ACCEPTED

    @property
    def error_count(self) -> int:
        return sum(self.error_counts.values())

    @property
    def output_schema(self) -> str | None:
        return OUTPUT_SCHEMA.get(self.schema or "")

    @classmethod
    def from_log(cls, log: IssueLog, **fields_: Any) -> GateReport:
        return cls(status=DatasetStatus.ACCEPTED if log.error_count == 0 else DatasetStatus.REJECTED,
                   errors=list(log.errors),
                   error_counts=dict(sorted(log.error_counts.items())), warnings=list(log.warnings),
                   warning_counts=dict(sorted(log.warning_counts.items())), **fields_)

    @classmethod
    def rejected(cls, issue: Issue, *, file: str | None = None, format: str | None = None) -> GateReport:
        """An upload refused before any row was read (unreadable file, archive bomb, ...)."""
        return cls(status=DatasetStatus.REJECTED, errors=[issue], error_counts={issue.code: 1}, file=file, format=format)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"accepted": self.accepted, "status": self.status}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "counts":
                out.update(asdict(value))
                continue
            if f.name in ("errors", "warnings"):
                value = [i.as_dict() for i in value]
            elif f.name in ("near_dup", "contamination", "pii", "toxicity", "images") and value is not None:
                value = asdict(value)
            elif f.name == "tokenization" and value is not None:
                value = value.model_dump()
            elif f.name == "stats":
                value = asdict(value) if value is not None else {}
            elif f.name == "cost_estimate" and value is not None:
                value = value.as_dict()
            elif f.name == "file" and value is None:
                continue
            out[f.name] = value
        out["error_count"] = self.error_count
        out["output_schema"] = self.output_schema
        return out
