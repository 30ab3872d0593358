"""What the checks found: the audit trail, the issue log and the counts, with the action for
each finding decided in one place (`domain.actions.action_for`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...domain.actions import REJECTED, RULES, action_for
from ...domain.issues import IssueLog
from ...domain.policies import Policies
from ...domain.report import RowCounts


class Findings:
    def __init__(self, policies: Policies, audit_path: Path, max_listed: int) -> None:
        self.policies, self.audit_path = policies, audit_path
        self.log = IssueLog(limit=max_listed)
        self.counts = RowCounts()
        self.overlap_lines: set[int] = set()
        self._audit = open(audit_path, "wb")

    def found(self, check: str, line: int, message: str, *, verb: str | None = None, **detail: Any) -> str:
        """Record a finding of `check` on `line`; returns removed / flagged / rejected."""
        action = action_for(check, self.policies)
        rule = RULES[check]
        self._audit.write(json.dumps({"line": line, "action": action, "reason": check, **detail}).encode() + b"\n")
        if action == REJECTED:
            assert rule.error_code and rule.policy
            self.log.error(rule.error_code, f"{message} (policy {rule.policy}={getattr(self.policies, rule.policy)})",
                           line)
        elif rule.warning_code and action in rule.warn_on:
            self.log.warn(rule.warning_code, f"{message}; {verb or action}", line)
        return action

    def overlap(self, line: int, message: str) -> None:
        """A validation row that duplicates a training row (exactly or nearly): one warning per row."""
        if line not in self.overlap_lines:
            self.overlap_lines.add(line)
            self.log.warn("train_validation_overlap", message, line)

    def close(self) -> None:
        self._audit.close()
