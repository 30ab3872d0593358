"""The one rule from a check's finding and the tenant's policy to what happens to the row. Pure.

    removed  - the row is left out of the cleaned files (the dataset may still be accepted)
    flagged  - the row stays; the finding is a warning and an audit entry
    rejected - the row is an error: the dataset is rejected

| check           | policy field  | policy value -> action                                     | error code    |
|-----------------|---------------|------------------------------------------------------------|---------------|
| exact_duplicate | -             | always removed                                             |               |
| near_duplicate  | near_dup      | remove -> removed, flag -> flagged                         |               |
| contamination   | contamination | flag -> flagged, remove -> removed                         |               |
| pii             | pii           | warn, redact -> flagged, block -> rejected                 | pii_blocked   |
| toxicity        | toxicity      | flag -> flagged, remove -> removed, block -> rejected      | toxic_blocked |
| over_length     | over_length   | truncate -> flagged, drop -> removed, reject -> rejected   | too_long      |
"""

from __future__ import annotations

from dataclasses import dataclass

from .policies import Policies

REMOVED, FLAGGED, REJECTED = "removed", "flagged", "rejected"


@dataclass(frozen=True)
class Rule:
    policy: str | None                 # the Policies field that decides, None: fixed
    actions: dict[str, str]            # policy value -> action
    error_code: str | None = None      # the error when rejected
    warning_code: str | None = None    # the per-row warning (None: a summary warning covers the check)
    warn_on: frozenset[str] = frozenset({FLAGGED, REMOVED})


RULES: dict[str, Rule] = {
    "exact_duplicate": Rule(None, {"": REMOVED}),
    "near_duplicate": Rule("near_dup", {"remove": REMOVED, "flag": FLAGGED}),
    "contamination": Rule("contamination", {"flag": FLAGGED, "remove": REMOVED}, warning_code="contamination"),
    "pii": Rule("pii", {"warn": FLAGGED, "redact": FLAGGED, "block": REJECTED}, "pii_blocked", "pii"),
    "toxicity": Rule("toxicity", {"flag": FLAGGED, "remove": REMOVED, "block": REJECTED}, "toxic_blocked",
                     "toxicity"),
    "over_length": Rule("over_length", {"truncate": FLAGGED, "drop": REMOVED, "reject": REJECTED}, "too_long",
                        "over_length_dropped", frozenset({REMOVED})),
}


def action_for(check: str, policies: Policies) -> str:
    """removed / flagged / rejected for a finding of `check` under `policies`."""
    rule = RULES[check]
    return rule.actions[getattr(policies, rule.policy) if rule.policy else ""]


def keeps_row(action: str) -> bool:
    return action == FLAGGED
