from datetime import timedelta

from pydantic_settings import SettingsConfigDict

from whetstone.runtime.settings import ServiceSettings


class SchedulerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="WHETSTONE_SCHEDULER_", extra="ignore")
    http_port: int = 8100
    default_gpu_type: str = "cpu"
    node_timeout_s: float = 20.0
    lost_node_check_s: float = 5.0
    dataset_wait_s: float = 600.0

    @property
    def node_timeout(self) -> timedelta:
        return timedelta(seconds=self.node_timeout_s)
