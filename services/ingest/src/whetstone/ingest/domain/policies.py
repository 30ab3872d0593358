"""What the data gate does about what it finds, per tenant (and per job for the over-length rule). Pure."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from pydantic import BaseModel, ConfigDict

CHOICES: dict[str, tuple[str, ...]] = {
    "pii": ("warn", "redact", "block"),
    "contamination": ("flag", "remove"),
    "toxicity": ("off", "flag", "remove", "block"),
    "over_length": ("reject", "truncate", "drop"),
    "near_dup": ("remove", "flag", "off"),
}


class PolicyError(ValueError):
    pass


class PolicyOverrides(BaseModel):
    """Policies a tenant's settings, a run or the CLI set (None: as before). An unknown name is
    refused where the overrides are read; the values are checked by `Policies`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pii: str | None = None
    contamination: str | None = None
    contamination_threshold: float | None = None
    toxicity: str | None = None
    toxicity_threshold: float | None = None
    near_dup: str | None = None
    near_dup_threshold: float | None = None
    over_length: str | None = None
    max_seq_len: int | None = None


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

    def merged(self, overrides: PolicyOverrides | None) -> Policies:
        """These policies with `overrides` applied (the policies they leave None unchanged)."""
        return replace(self, **overrides.model_dump(exclude_none=True)) if overrides else self

    def as_strings(self) -> dict[str, str]:
        """For DatasetValidatedV1.policies (a str -> str map)."""
        return {k: str(v) for k, v in asdict(self).items()}
