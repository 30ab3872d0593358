"""Settings shared by every service (prefix WHETSTONE_) and the per-service base."""

from __future__ import annotations

import os
import shlex
import ssl
from pathlib import Path
from typing import TypedDict

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_TENANTS = {"demo": "standard", "acme": "premium", "hobbyist": "free"}


class KafkaClientOptions(TypedDict, total=False):
    """aiokafka client keyword arguments for the configured security."""

    security_protocol: str
    sasl_mechanism: str
    sasl_plain_username: str | None
    sasl_plain_password: str | None
    ssl_context: ssl.SSLContext


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
    max_crash_deliveries: int = Field(
        default=5, ge=1, description="deliveries of a record that never completed (the process died while handling"
                                     " it) before it goes to <topic>.dlq; more than max_attempts, because a restart"
                                     " for another reason (a deploy, a drain, a kill) interrupts an innocent record too")
    outbox_retention_hours: float = Field(default=24.0, gt=0, description="sent outbox rows are deleted after this")
    inbox_retention_days: float = Field(default=14.0, gt=0,
                                        description="inbox rows (dedup memory) are deleted after this: keep it"
                                                    " longer than the topics' retention")
    transient_retry_s: float = Field(default=300.0, ge=0,
                                     description="how long a handler whose dependency is down (Postgres, S3, network)"
                                                 " is retried with backoff before its attempts count")
    retention_interval_s: float = Field(default=600.0, gt=0, description="how often retention runs")
    http_host: str = Field(default="127.0.0.1", description="bind address of every service's HTTP server; "
                           "0.0.0.0 in a cluster (WHETSTONE_HTTP_HOST)")
    max_body_bytes: int = Field(default=1 << 20, gt=0, description="largest request body a service route takes "
                                "(uploads stream under their own limit); larger: 413 before it is read")
    api_docs: bool = Field(default=False, description="serve /docs and /openapi.json on the service ports "
                           "(development only: they map every route, internal ones included)")
    log_level: str = "INFO"
    log_json: bool = True
    # Kafka security (production: Strimzi SCRAM-SHA-512 users, deploy/kafka/users.yaml); unset = PLAINTEXT
    kafka_security_protocol: str = Field(default="PLAINTEXT", description="PLAINTEXT|SASL_PLAINTEXT|SASL_SSL|SSL")
    kafka_sasl_mechanism: str = Field(default="SCRAM-SHA-512", description="with SASL_*: SCRAM-SHA-512|SCRAM-SHA-256|PLAIN")
    kafka_sasl_username: str | None = None
    kafka_sasl_password: str | None = None
    create_topics: bool = Field(default=True, description="create the contract topics at start-up; false where an "
                                "operator manages them (Strimzi KafkaTopic) and services may not create topics")
    startup_broker_wait_s: float = Field(default=300.0, description="how long start-up waits, retrying with "
                                         "backoff, for an unreachable broker before the process exits")
    kafka_metadata_max_age_s: float = Field(
        default=15.0, gt=0, description="how often Kafka clients refresh topic metadata. A consumer that joined its "
                                        "group while the broker could not describe the topics (a broker restarting) "
                                        "holds no partitions until the next refresh, which notices the topics and "
                                        "rejoins; Kafka's default of 5 minutes would leave it idle that long")

    def kafka_client_options(self) -> KafkaClientOptions:
        """aiokafka client keyword arguments for the configured security (empty for PLAINTEXT)."""
        if self.kafka_security_protocol == "PLAINTEXT":
            return {}
        options = KafkaClientOptions(security_protocol=self.kafka_security_protocol)
        if self.kafka_security_protocol.startswith("SASL"):
            options.update(KafkaClientOptions(sasl_mechanism=self.kafka_sasl_mechanism,
                                              sasl_plain_username=self.kafka_sasl_username,
                                              sasl_plain_password=self.kafka_sasl_password))
        if self.kafka_security_protocol.endswith("SSL"):
            options.update(KafkaClientOptions(ssl_context=ssl.create_default_context()))
        return options

    @property
    def model_catalog(self) -> Path:
        return self.models_dir or self.data_dir / "models"


DEFAULT_S3_CREDENTIALS = ("whetstone", "whetstone-secret")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def check_credentials(settings: CommonSettings) -> None:
    """A service refuses to start with the default S3 credentials anywhere but the dev stack (an
    embedded SeaweedFS on loopback): SystemExit naming the settings to set."""
    from urllib.parse import urlsplit  # noqa: PLC0415

    if (settings.s3_access_key, settings.s3_secret_key) != DEFAULT_S3_CREDENTIALS:
        return
    host = urlsplit(settings.s3_endpoint or "").hostname or ""
    if host in LOOPBACK_HOSTS or host.startswith("127."):
        return
    raise SystemExit(f"refusing to start: the object store at {settings.s3_endpoint or 'AWS S3'} would be used with "
                     "the development stack's default credentials; set WHETSTONE_S3_ACCESS_KEY and "
                     "WHETSTONE_S3_SECRET_KEY")


class ServiceSettings(BaseSettings):
    """Per-service knobs; subclasses set env_prefix WHETSTONE_<SVC>_ for their own fields."""

    model_config = SettingsConfigDict(extra="ignore")
    http_port: int = 0


def load_stack_env(data_dir: Path) -> None:
    """Adopt the endpoints `whet stack up` wrote, unless set explicitly already."""
    env_file = data_dir / "stack.env"
    if not env_file.exists():
        return
    for line in env_file.read_text().splitlines():
        k, sep, v = line.partition("=")
        if sep and k.strip().startswith("WHETSTONE_"):
            value = shlex.split(v)[0] if v.strip() else ""
            os.environ.setdefault(k.strip(), value)


def resolve_settings() -> CommonSettings:
    settings = CommonSettings()
    load_stack_env(settings.data_dir)
    settings = CommonSettings()
    missing = [n for n in ("kafka_bootstrap", "database_url", "s3_endpoint") if not getattr(settings, n)]
    if missing:
        raise SystemExit(
            f"no {', '.join(missing)} configured: run `whet stack up` (embedded stack) or set "
            + ", ".join(f"WHETSTONE_{m.upper()}" for m in missing))
    return settings
