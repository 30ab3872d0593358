"""Metering's own vocabularies. The shared ones (ChargeClass, UsageScope, ErrorClass,
PreemptionReason) are the contract's, in whetstone.contracts.enums."""

from __future__ import annotations

from enum import StrEnum


class StopKind(StrEnum):
    """How a segment ended."""

    COMPLETED = "completed"
    FAILED = "failed"
    PREEMPTED = "preempted"


class TerminalKind(StrEnum):
    """The lifecycle event that ended a job."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Outcome(StrEnum):
    """A finished job's outcome, as its total line and the monthly roll-ups name it."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class EntryKind(StrEnum):
    """An append-only ledger row: a charge, or the reversal of an earlier one."""

    CHARGE = "charge"
    REVERSAL = "reversal"


class ReviewDecision(StrEnum):
    """An operator's decision on a job held for review."""

    CHARGE = "charge"
    REFUND = "refund"
