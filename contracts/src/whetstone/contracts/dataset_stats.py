"""The figures `dataset.validated` carries in `stats`: ingest's data gate summary of the upload (lists
capped; the whole report is at the event's report_uri).

Every field is optional and only the fields given are written back: a rejected upload carries its
size alone, an accepted one the gate's figures. A consumer keeps keys it does not know (a newer
ingest's) and writes them back after the known ones; a producer may send none."""

from __future__ import annotations

from pydantic import ConfigDict

from .base import GivenFieldsOnly


class TokenBucket(GivenFieldsOnly):
    """Rows whose token length is in [min, max); `max` None: the open-ended last bucket."""

    min: int
    max: int | None = None
    count: int


class NearDuplicateCluster(GivenFieldsOnly):
    """The line kept and (the first of) the lines removed as its near-copies."""

    kept_line: int
    duplicate_lines: list[int]
    size: int
    max_jaccard: float


class ContaminatedRow(GivenFieldsOnly):
    """A row found in a reference set: the fraction of its n-grams there, and which set."""

    line: int
    fraction: float
    reference: str | None = None


class MaskPreview(GivenFieldsOnly):
    """A row rendered with the chat template, its trained tokens wrapped in [[ ]]."""

    line: int
    rendered: str


class TokenizationSummary(GivenFieldsOnly):
    """How the rows were tokenized for the base model (or estimated without one)."""

    max_seq_len: int
    over_length_policy: str
    tokenizer: str | None = None
    tokenizer_hash: str | None = None
    fingerprint: str | None = None
    cache: str | None = None             # None (no earlier counts), "reused" or "stale"
    over_length: int = 0
    truncated: int = 0
    dropped: int = 0
    mask_preview: list[MaskPreview] = []
    tokenized_uri: str | None = None
    tokenized_cache: str | None = None   # "written" or "hit"


class DatasetStats(GivenFieldsOnly):
    """The gate's figures, in the order ingest writes them."""

    model_config = ConfigDict(extra="allow")

    train_rows: int | None = None
    validation_rows: int | None = None
    exact_duplicates: int | None = None
    near_duplicates: int | None = None
    contaminated: int | None = None
    pii_hits: int | None = None
    toxic: int | None = None
    size_bytes: int | None = None
    output_schema: str | None = None
    tokens_estimated: bool | None = None
    layout: str | None = None
    layout_counts: dict[str, int] | None = None
    role_mapping: dict[str, dict[str, str]] | None = None
    ignored_keys: dict[str, int] | None = None
    error_counts: dict[str, int] | None = None
    warning_counts: dict[str, int] | None = None
    tokens: dict[str, int | float] | None = None     # token lengths: rows, total, min, mean, p50, p90, p99, max
    token_histogram: list[TokenBucket] | None = None
    roles: dict[str, int] | None = None              # messages per role
    turns: dict[str, int] | None = None              # rows per number of turns
    trained_tokens: int | None = None
    near_dup_clusters: list[NearDuplicateCluster] | None = None
    contamination_examples: list[ContaminatedRow] | None = None
    references: dict[str, dict[str, int]] | None = None   # reference set -> its items and n-grams
    pii_by_kind: dict[str, int] | None = None
    tokenization: TokenizationSummary | None = None
    timings: dict[str, int | float] | None = None    # seconds per gate phase
    images: int | None = None                        # images in the rows written
    rows_with_images: int | None = None              # the scheduler refuses a job whose base cannot see them
    base_model: str | None = None                    # the base model the upload was checked against
    tokenized_uri: str | None = None
    tokenized_cache: str | None = None
    audit_uri: str | None = None                     # the gate's per-row audit log, when it wrote one
