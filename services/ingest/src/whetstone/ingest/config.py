from pydantic_settings import SettingsConfigDict

from whetstone.runtime.settings import ServiceSettings


class IngestSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="WHETSTONE_INGEST_", extra="ignore")
    http_port: int = 8101
    min_examples: int = 10
    max_examples: int = 1_000_000
    validation_fraction: float = 0.1
    max_upload_bytes: int = 10 * 1024**3
