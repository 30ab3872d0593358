"""Row pass: a prepared record (`prepare.Prepared`) -> a candidate row, or the errors that stop it.

The pure work (parse, layout, normalise, PII scan, digests, screens) is done by `prepare`;
here, in file order, the findings are applied: errors logged, PII counted and acted on
(warn / redact / block), over-long rows refused, images counted (and the per-file cap on
examples with images applied)."""

from __future__ import annotations

from ...adapters.formats import Source
from ...domain.actions import keeps_row
from ...domain.issues import Issue
from ...domain.images import ImageLimits
from ...domain.report import IMAGE_ISSUES, ImageReport, PiiReport
from ...domain.rows import LayoutGate
from .findings import Findings
from .prepare import Candidate, Prepared

__all__ = ["Candidate", "RowPass"]


class RowPass:
    def __init__(self, layouts: LayoutGate, findings: Findings, pii: PiiReport, max_line_bytes: int,
                 source: Source, images: ImageReport | None = None) -> None:
        self.layouts, self.findings, self.pii, self.max_line_bytes = layouts, findings, pii, max_line_bytes
        self.source = source
        self.images = images or ImageReport.for_limits(ImageLimits())
        self.tool_rows = 0

    def take(self, prepared: Prepared) -> Candidate | None:
        log = self.findings.log
        self.findings.counts.rows_total += 1
        if prepared.issues:
            for issue in prepared.issues:
                log.add_error(self._with_dialect(issue))
                self.images.images_refused += issue.code in IMAGE_ISSUES
            return None
        if prepared.pii and not self._pii(prepared.pii, prepared.line):
            return None
        if prepared.too_long:
            log.error("line_too_long", f"row text is longer than {self.max_line_bytes} characters", prepared.line)
            return None
        self.tool_rows += prepared.tools
        candidate = prepared.candidate
        if candidate is not None and candidate.images is not None:
            if self.images.rows_read >= self.images.max_examples:
                log.error("too_many_image_examples", f"more than {self.images.max_examples:,} examples with images "
                          "in the file (the limit per file)", prepared.line)
                self.images.images_refused += 1
                return None
            self.images.read(candidate.images)
        return candidate

    def _with_dialect(self, issue: Issue) -> Issue:
        """A CSV row that fits no layout may be a wrong delimiter guess: say how the file was read."""
        if self.source.dialect and issue.code in ("unknown_schema", "missing_key"):
            return Issue(issue.code, f"{issue.message} (read as {self.source.format.upper()} with "
                         f"{self.source.dialect})", issue.line, issue.field)
        return issue

    def _pii(self, counts: dict[str, int], line: int) -> bool:
        """Count and act on the PII found in a row (already redacted when asked); False when it is blocked."""
        self.findings.counts.pii_hits += sum(counts.values())
        self.pii.rows += 1
        for kind, n in counts.items():
            self.pii.by_kind[kind] = self.pii.by_kind.get(kind, 0) + n
        kinds = ", ".join(f"{k} x{n}" for k, n in sorted(counts.items()))
        redact = self.pii.policy == "redact"
        action = self.findings.found("pii", line, f"personal data found ({kinds})", verb="redacted" if redact else
                                     "kept", kinds=counts, redacted=redact)
        return keeps_row(action)
