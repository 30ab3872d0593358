from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from whetstone.contracts.enums import ModelStage
from whetstone.runtime.settings import ServiceSettings


class RegistrySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="WHETSTONE_REGISTRY_", extra="ignore")
    http_port: int = 8104
    auto_promote: bool = Field(False, description="promote to production at registration when the policy passes")
    auto_promote_min_margin: float = Field(0.10, ge=0, description="smallest relative eval margin over the base")
    presign_ttl_s: int = Field(3600, ge=60, le=7 * 24 * 3600)
    public_base_url: str | None = Field(None, description="when set (the platform's public API URL, e.g. https://"
                                        "whetstone.example.com), download listings point at the API, which streams "
                                        "each verified file to a caller with a read key, instead of at presigned "
                                        "object-store URLs: for users who cannot reach the object store")
    # vLLM handoff (adapters/vllm.py): empty = off
    vllm_urls: list[str] = Field(default_factory=list, description="base URLs of the vLLM servers to keep in step")
    vllm_api_key: str | None = None
    vllm_adapter_dir: Path | None = Field(None, description="directory shared with vLLM (its LoRA resolver dir)")
    vllm_stages: list[ModelStage] = Field(default_factory=lambda: [ModelStage.PRODUCTION])
    vllm_sync_interval_s: float = Field(5.0, gt=0)
    # experiment tracking: the operator's MLflow server (jobs asking for `mlflow` log to it); unset = off.
    # One setting for the platform: the scheduler reads it too, to accept or refuse `mlflow` integrations
    mlflow_tracking_uri: str | None = Field(None, validation_alias="WHETSTONE_MLFLOW_TRACKING_URI")
    mlflow_timeout_s: float = Field(30.0, gt=0, description="one request to the tracking server")
    mlflow_poll_s: float = Field(1.0, gt=0, description="how often the tracker looks for items to send")
    mlflow_retry_s: float = Field(5.0, gt=0, description="first backoff after a failed send (then doubling)")
    mlflow_retry_max_s: float = Field(300.0, gt=0, description="the longest backoff")
    mlflow_give_up_after: int = Field(30, ge=1, description="failed tries in a row before a job's run is given up")
