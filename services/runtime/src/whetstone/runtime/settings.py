"""Settings shared by every service (prefix WHETSTONE_) and the per-service base."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_TENANTS = {"demo": "standard", "acme": "premium", "hobbyist": "free"}


class CommonSettings(BaseSettings):
    """Where the stack lives. Unset Kafka/Postgres/S3 means: use the embedded stack
    whose endpoints `whet stack up` wrote to ``<data_dir>/stack.env``."""

    model_config = SettingsConfigDict(env_prefix="WHETSTONE_", extra="ignore")

    kafka_bootstrap: str | None = None
    database_url: str | None = None
    s3_endpoint: str | None = None
    s3_access_key: str = "whetstone"
    s3_secret_key: str = "whetstone-secret"
    s3_region: str = "us-east-1"
    bucket: str = "whetstone"
    data_dir: Path = Path(".whetstone")
    models_dir: Path | None = Field(default=None, description="local base-model catalog; default <data_dir>/models")
    tenants: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_TENANTS),
                                    description="tenant id -> tier (free|standard|premium)")
    max_attempts: int = Field(default=3, ge=1, description="handler attempts before a message goes to <topic>.dlq")
    log_level: str = "INFO"
    log_json: bool = True

    @property
    def model_catalog(self) -> Path:
        return self.models_dir or self.data_dir / "models"


class ServiceSettings(BaseSettings):
    """Per-service knobs; subclasses set env_prefix WHETSTONE_<SVC>_ for their own fields."""

    model_config = SettingsConfigDict(extra="ignore")
    http_port: int = 0
