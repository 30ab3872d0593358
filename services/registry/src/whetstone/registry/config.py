from pydantic_settings import SettingsConfigDict

from whetstone.runtime.settings import ServiceSettings


class RegistrySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="WHETSTONE_REGISTRY_", extra="ignore")
    http_port: int = 8104
