"""The last pass: file-level checks, summary warnings and the cost estimate -> the typed GateReport."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from whetstone.contracts.dataset_stats import TokenizationSummary

from ...adapters.formats import Source
from ...domain.actions import action_for
from ...domain.cost import CostEstimate, estimate_cost
from ...domain.issues import Issue
from ...domain.policies import Policies
from ...domain.report import ContaminationReport, GateReport, ImageReport, NearDupReport, PiiReport, ToxicityReport
from ...domain.rows import LayoutGate
from .dedup import ExactDedup
from .findings import Findings
from .write import Written


@dataclass
class Limits:
    min_examples: int
    max_examples: int
    epochs: int
    throughput: dict[str, dict[str, float]]
    prices: dict[str, dict[str, float]]


@dataclass
class Sections:
    near_dup: NearDupReport
    contamination: ContaminationReport
    pii: PiiReport
    toxicity: ToxicityReport
    tokenization: TokenizationSummary
    images: ImageReport | None = None


def build_report(source: Source, layouts: LayoutGate, findings: Findings, exact: ExactDedup, near_clusters: int,
                 written: Written, sections: Sections, limits: Limits, *, tokenized: bool, tool_rows: int,
                 model_params: tuple[int | None, str], extra_warnings: list[Issue]) -> GateReport:
    log, counts, policies = findings.log, findings.counts, findings.policies
    for issue in layouts.file_issues:
        log.add_error(issue)
    counts.rows_kept, counts.train_rows, counts.validation_rows = written.kept, *written.rows
    purpose = layouts.purpose or "sft"
    if counts.rows_total == 0:
        log.error("empty_file", "the file holds no rows")
    if written.kept < limits.min_examples:
        log.error("too_few_examples", f"{written.kept} usable examples; at least {limits.min_examples} are required")
    if written.kept > limits.max_examples:
        log.error("too_many_examples", f"{written.kept} examples; this tier allows {limits.max_examples}")
    _summary_warnings(source, layouts, findings, exact, near_clusters, written, sections, policies, purpose,
                      tokenized=tokenized, tool_rows=tool_rows, extra=extra_warnings)
    params, params_source = model_params
    cost: CostEstimate | None = None
    if purpose != "eval":
        cost = estimate_cost(written.tokens[0], limits.epochs, purpose, params, throughput=limits.throughput,
                             prices=limits.prices, tokens_estimated=not tokenized, params_source=params_source)
    notes = []
    if layouts.schema in ("prompt_completion", "instruction"):
        notes.append(f"{layouts.schema} rows are written as chat conversations (user -> assistant)")
    elif layouts.schema == "preference":
        notes.append("preference rows are written as {prompt, chosen, rejected} message lists")
    return GateReport.from_log(
        log, format=source.format, schema=layouts.schema, layout=layouts.layout,
        layout_counts=dict(layouts.layout_counts), role_mapping=layouts.role_mapping(),
        ignored_keys=dict(layouts.facts.ignored), purpose=purpose, counts=counts,
        tokens_total=written.stats.tokens_total, tokens_estimated=not tokenized, policies=policies.as_strings(),
        exact_duplicate_lines=exact.lines, near_dup=sections.near_dup, contamination=sections.contamination,
        pii=sections.pii, toxicity=sections.toxicity, tokenization=sections.tokenization,
        images=sections.images if sections.images is not None and sections.images.seen else None,
        stats=written.stats.summary(), cost_estimate=cost, notes=notes)


def _summary_warnings(source: Source, layouts: LayoutGate, findings: Findings, exact: ExactDedup, near_clusters: int,
                      written: Written, sections: Sections, policies: Policies, purpose: str, *, tokenized: bool,
                      tool_rows: int, extra: list[Issue]) -> None:
    log, c = findings.log, findings.counts
    for note in [*source.notes, *extra]:
        log.warn(note.code, note.message, note.line, note.field)
    if source.blank_lines:
        log.warn("blank_lines", f"{source.blank_lines} blank line(s) skipped")
    if layouts.facts.ignored:
        listed = ", ".join(f"{k} ({n} row{'s' * (n != 1)})" for k, n in sorted(
            layouts.facts.ignored.items(), key=lambda kv: -kv[1])[:20])
        log.warn("ignored_keys", f"ignored key(s) no layout reads: {listed}")
    for both, n in layouts.ambiguous.items():
        first = both.split(" or ")[0]
        log.warn("ambiguous_layout", f"{n} row(s) fit {both}; read as {first} (set the purpose to choose: "
                 "sft for chat, dpo for preference pairs)")
    if c.exact_duplicates:
        lines = ", ".join(map(str, exact.lines[:10]))
        log.warn("exact_duplicates", f"{c.exact_duplicates} exact duplicate row(s) removed (lines {lines}"
                 f"{', ...' if c.exact_duplicates > 10 else ''})")
    if c.near_duplicates:
        action = action_for("near_duplicate", policies)
        log.warn("near_duplicates", f"{c.near_duplicates} near-duplicate row(s) (Jaccard >= "
                 f"{policies.near_dup_threshold}) in {near_clusters} cluster(s); {action}")
    tok = sections.tokenization
    if tok.truncated:
        log.warn("truncated", f"{tok.truncated} row(s) longer than {tok.max_seq_len} tokens will be truncated")
    if not tokenized and written.kept:
        log.warn("tokens_estimated", "no base model given: token counts and cost are estimates "
                 "(characters / 4); a job counts them exactly with its base model (offline: `whet datasets "
                 "check FILE --base-model NAME`)")
        if written.estimated_over:
            log.warn("may_exceed_context", f"about {written.estimated_over} row(s) may exceed {tok.max_seq_len} tokens")
        if tool_rows:
            log.warn("tools_unchecked", f"{tool_rows} row(s) use tools or tool calls; whether the base model's chat "
                     "template renders them is checked when a job uses the file (offline: `whet datasets check FILE "
                     "--base-model NAME`)")
    images = sections.images
    if images is not None and images.converted:
        modes = ", ".join(f"{m} x{n}" for m, n in sorted(images.by_mode.items()) if m not in ("RGB", "RGBA"))
        log.warn("images_converted", f"{images.converted} image(s) are grey or palette images ({modes}); they are "
                 "converted to RGB (RGBA when transparent) at training time")
    outliers = written.stats.outliers()
    if outliers:
        log.warn("length_outliers", f"{outliers} row(s) are over 8x the median length")
    if purpose != "eval" and written.rows[0] and not written.rows[1]:
        log.warn("no_validation_rows", "no rows fell into the validation split; upload a validation set "
                 "for a meaningful eval")
