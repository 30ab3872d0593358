"""Batch screening passes: contamination against the reference sets, then toxicity.
Each takes the batch's rows and returns the rows that stay. The scores were computed by
`prepare` (per chunk, maybe in a worker process); a plugged-in toxicity classifier scores
the rows here, only those still kept."""

from __future__ import annotations

import numpy as np

from ...domain.actions import keeps_row
from ...domain.contamination import ReferenceIndex, is_contaminated
from ...domain.report import ContaminatedExample, ContaminationReport, ToxicityReport
from ...domain.toxicity import ToxicityClassifier
from .findings import Findings
from .rows import Candidate


class Contamination:
    def __init__(self, references: ReferenceIndex, findings: Findings, report: ContaminationReport,
                 max_listed: int) -> None:
        self.references, self.findings, self.report, self.max_listed = references, findings, report, max_listed

    def run(self, rows: list[Candidate]) -> list[Candidate]:
        keep = np.ones(len(rows), dtype=bool)
        for i, p in enumerate(rows):
            assert p.contamination is not None, "prepare computes every candidate's contamination"
            fraction, name = p.contamination
            if not is_contaminated(fraction, self.report.threshold):
                continue
            self.findings.counts.contaminated += 1
            action = self.findings.found(
                "contamination", p.line, f"{fraction:.0%} of the row's 13-grams occur in reference set {name!r}",
                fraction=round(fraction, 4), reference=name)
            keep[i] = keeps_row(action)
            if len(self.report.examples) < self.max_listed:
                self.report.examples.append(ContaminatedExample(p.line, round(fraction, 3), name))
        return rows if keep.all() else [p for p, k in zip(rows, keep) if k]


class Toxicity:
    def __init__(self, classifier: ToxicityClassifier, findings: Findings, report: ToxicityReport,
                 threshold: float) -> None:
        self.classifier, self.findings, self.report, self.threshold = classifier, findings, report, threshold

    def run(self, rows: list[Candidate]) -> list[Candidate]:
        unscored = [p for p in rows if p.toxicity is None]
        if unscored:
            for p, score in zip(unscored, self.classifier.scores([p.text or "" for p in unscored])):
                p.toxicity = score
        scores = [p.toxicity or 0.0 for p in rows]      # every row is scored by now
        keep = [True] * len(rows)
        for i, score in enumerate(scores):
            if score >= self.threshold:
                self.findings.counts.toxic += 1
                self.report.flagged += 1
                action = self.findings.found("toxicity", rows[i].line, f"toxicity score {score:.2f} "
                                             f"({self.classifier.name})", score=round(float(score), 3),
                                             classifier=self.classifier.name)
                keep[i] = keeps_row(action)
        return rows if all(keep) else [p for p, k in zip(rows, keep) if k]
