"""What the data gate does about what it finds, per tenant (and per job for the over-length rule). Pure."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

CHOICES: dict[str, tuple[str, ...]] = {
    "pii": ("warn", "redact", "block"),
    "contamination": ("flag", "remove"),
    "toxicity": ("off", "flag", "remove", "block"),
    "over_length": ("reject", "truncate", "drop"),
    "near_dup": ("remove", "flag", "off"),
}


class PolicyError(ValueError):
    pass


@dataclass(frozen=True)
class Policies:
    pii: str = "warn"
    contamination: str = "flag"
    contamination_threshold: float = 0.5
    toxicity: str = "flag"
    toxicity_threshold: float = 0.5
    near_dup: str = "remove"
    near_dup_threshold: float = 0.9
    over_length: str = "truncate"
    max_seq_len: int | None = None          # None: the tokenizer's own limit, else 4096

    def __post_init__(self) -> None:
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise PolicyError(f"policy {name}={getattr(self, name)!r}; choose one of {', '.join(allowed)}")
        for name in ("contamination_threshold", "toxicity_threshold", "near_dup_threshold"):
            if not 0 < float(getattr(self, name)) <= 1:
                raise PolicyError(f"{name} must be in (0, 1]")
        if self.max_seq_len is not None and self.max_seq_len < 1:
            raise PolicyError("max_seq_len must be positive")

    def merged(self, overrides: dict[str, Any] | None) -> Policies:
        """These policies with `overrides` applied (unknown names rejected, None values ignored)."""
        known = {f.name for f in fields(self)}
        unknown = set(overrides or {}) - known
        if unknown:
            raise PolicyError(f"unknown policy name(s): {', '.join(sorted(unknown))}")
        return replace(self, **{k: v for k, v in (overrides or {}).items() if v is not None})

    def as_strings(self) -> dict[str, str]:
        """For DatasetValidatedV1.policies (a str -> str map)."""
        return {k: str(v) for k, v in asdict(self).items()}
