"""Validation issues: the stable code catalogue and a capped, counted log.

Every problem the data gate reports has a stable `code` (clients match on it), a
human message, and where known the 1-based line (JSONL/CSV line, Parquet/Arrow row)
and the field. Codes never change meaning; new checks get new codes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# code -> what it means. Errors reject the dataset; warnings do not.
ERROR_CODES: dict[str, str] = {
    # the upload as a whole
    "empty_file": "the upload holds no bytes or no rows",
    "file_too_large": "the upload exceeds the size limit",
    "insufficient_storage": "the upload or its unpacked archive does not fit on the ingest disk's free space "
                            "(less the operator's reserve)",
    "binary_file": "the upload is binary, not a dataset",
    "unsupported_format": "not JSONL, Parquet, CSV, a datasets save_to_disk directory or an archive of one",
    "extension_mismatch": "the file name's extension does not match its content",
    "unsafe_name": "the dataset name is path-like or contains control characters",
    "archive_bomb": "an archive decompresses past the size or compression-ratio limits",
    "archive_unsafe": "an archive member is a link, escapes the archive (../, absolute path) or is itself an archive",
    "archive_invalid": "an archive is corrupt, empty, or holds more than one dataset",
    "unreadable_file": "the Parquet/Arrow/CSV file is corrupt or cannot be read",
    "json_array": "a JSON array document; the format is JSON Lines (one object per line)",
    "hub_unreachable": "the dataset is a Hub id but the Hugging Face Hub cannot be reached",
    "hub_error": "the Hub dataset could not be loaded",
    "base_model_unavailable": "the base model's tokenizer or chat template cannot be loaded",
    "dataset_id_mismatch": "the submitted dataset_id is neither the content address of the bytes nor a file id of the tenant",
    "unknown_tenant": "the tenant is not registered",
    "source_outside_tenant": "the source object is not under the tenant's prefix",
    "source_missing": "the source object does not exist",
    "processing_failed": "the data gate failed on this upload (a platform bug, logged)",
    "too_few_examples": "fewer usable examples than the minimum",
    "too_many_examples": "more examples than the tenant's tier allows",
    "schema_purpose_mismatch": "the data schema cannot be used for the requested purpose",
    # one line / row
    "line_too_long": "a line exceeds the maximum line length",
    "bom": "a UTF-8 byte-order mark inside a JSONL file (one at its very start is stripped)",
    "bad_encoding": "a line is not valid UTF-8",
    "invalid_json": "a line is not valid JSON",
    "invalid_number": "a NaN, Infinity or -Infinity literal (not JSON)",
    "binary_content": "a line or row holds a NUL byte or other binary content",
    "row_not_object": "a line is valid JSON but not an object",
    "unknown_schema": "a row matches none of the supported layouts",
    "mixed_schema": "a row's schema differs from the file's schema",
    "missing_key": "a required key is missing",
    "unknown_key": "a key that looks like a typo of a known one (other unknown keys are ignored)",
    "messages_not_list": "`messages` (or a preference side) must be a non-empty list",
    "message_not_object": "a message must be an object",
    "unknown_role": "a role other than system/user/assistant/tool (or a ShareGPT role that maps to one)",
    "content_not_string": "a message's content must be a string or a list of text parts",
    "content_part_unsupported": "an audio/file content part, or an image part outside a chat (messages) row",
    "image_role": "an image part in a system, assistant or tool message (images go in user messages)",
    "image_part_invalid": "an image_url part without an {url} object",
    "image_detail_invalid": "an image's detail other than auto, low or high",
    "image_url_refused": "an image URL that is not a base64 data URL (http(s):// fetching is off)",
    "image_fetch_refused": "an http(s) image URL not fetched: a non-public address, a redirect, an error status, "
                           "over the bytes or time cap",
    "image_bad_base64": "an image data URL whose base64 is invalid",
    "image_too_large": "an image over the bytes limit (10 MB)",
    "image_format_unsupported": "an image that is not JPEG, PNG or WEBP by its content (GIF, SVG, BMP, animated...)",
    "image_media_type_mismatch": "a data URL whose media type names another format than its bytes",
    "image_too_many_pixels": "an image over the pixel limit, read from its header (decompression bombs)",
    "image_mode_unsupported": "an image mode other than RGB/RGBA/L/LA/P/PA/1 (CMYK, 16-bit, float...)",
    "image_undecodable": "an image whose data is truncated or corrupt",
    "too_many_images": "an example with more images than the per-example limit (10)",
    "too_many_image_examples": "more examples with images than the per-file limit (50,000)",
    "images_unsupported_by_base": "the base model has no image processor: it cannot be trained on images",
    "bad_tool_call": "a malformed tool call, tool definition or tool_call_id",
    "tools_unsupported": "the row uses tools but the base model's chat template cannot render them",
    "empty_content": "a message's content is empty",
    "no_assistant": "a conversation without an assistant turn",
    "last_message_not_user": "a reinforcement fine-tuning row whose last message is not a user turn",
    "role_order": "system after the first turn, assistant before any user, or two assistants in a row",
    "bad_weight": "a per-message weight other than 0 or 1",
    "nothing_to_train": "every assistant turn has weight 0: no token would be trained",
    "field_not_string": "a text field (prompt, completion, instruction, text...) must be a string",
    "empty_field": "a required text field is empty",
    "chosen_equals_rejected": "a preference pair whose chosen and rejected answers are identical",
    "template_error": "the base model's chat template cannot render the row",
    "too_long": "the row is longer than max_seq_len tokens (over-length policy: reject)",
    "pii_blocked": "personal data found (PII policy: block)",
    "toxic_blocked": "the toxicity classifier flagged the row (toxicity policy: block)",
}

WARNING_CODES: dict[str, str] = {
    "blank_lines": "blank lines were skipped",
    "exact_duplicates": "exact duplicates were removed",
    "near_duplicates": "near-duplicates were removed",
    "contamination": "rows overlap a benchmark/eval reference set",
    "pii": "personal data found (policy warn or redact)",
    "toxicity": "rows flagged by the toxicity classifier",
    "truncated": "rows longer than max_seq_len will be truncated",
    "over_length_dropped": "rows longer than max_seq_len were dropped",
    "tokens_estimated": "no base model given: token counts are estimates (characters / 4)",
    "may_exceed_context": "by the estimate, some rows may exceed max_seq_len",
    "length_outliers": "rows far longer than the median",
    "no_validation_rows": "no rows fell into the validation split",
    "train_validation_overlap": "rows of the validation set duplicate training rows",
    "ignored_splits": "splits other than train/validation were ignored",
    "references_unavailable": "a benchmark reference set could not be loaded",
    "ignored_keys": "keys no layout reads were ignored (named, with row counts)",
    "ambiguous_layout": "rows fit two layouts; the default was used (set the purpose to choose)",
    "bom_stripped": "the JSONL file starts with a UTF-8 byte-order mark, which was stripped",
    "tools_unchecked": "rows use tools; without a base model its template's tool support is not checked",
    "images_converted": "grey or palette images (L, LA, P, PA, 1) are converted to RGB/RGBA at training time",
}


@dataclass(frozen=True)
class Issue:
    code: str
    message: str
    line: int | None = None
    field: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "line": self.line, "field": self.field}


@dataclass
class IssueLog:
    """All issues are counted; the first `limit` of each kind are kept verbatim."""

    limit: int = 100
    errors: list[Issue] = field(default_factory=list)
    warnings: list[Issue] = field(default_factory=list)
    error_counts: dict[str, int] = field(default_factory=dict)
    warning_counts: dict[str, int] = field(default_factory=dict)

    @property
    def error_count(self) -> int:
        return sum(self.error_counts.values())

    def error(self, code: str, message: str, line: int | None = None, fld: str | None = None) -> None:
        self.add_error(Issue(code, message, line, fld))

    def add_error(self, issue: Issue) -> None:
        assert issue.code in ERROR_CODES, f"unregistered error code {issue.code}"
        self.error_counts[issue.code] = self.error_counts.get(issue.code, 0) + 1
        if len(self.errors) < self.limit:
            self.errors.append(issue)

    def warn(self, code: str, message: str, line: int | None = None, fld: str | None = None) -> None:
        assert code in WARNING_CODES, f"unregistered warning code {code}"
        self.warning_counts[code] = self.warning_counts.get(code, 0) + 1
        if len(self.warnings) < self.limit:
            self.warnings.append(Issue(code, message, line, fld))
