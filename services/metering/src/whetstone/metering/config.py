from pydantic_settings import SettingsConfigDict

from whetstone.runtime.settings import ServiceSettings


class MeteringSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="WHETSTONE_METERING_", extra="ignore")
    http_port: int = 8105
