import socket
from pathlib import Path

from pydantic_settings import SettingsConfigDict

from whetstone.runtime.settings import ServiceSettings


class TrainerAgentSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="WHETSTONE_TRAINER_AGENT_", extra="ignore")
    http_port: int = 8102
    node_id: str = f"cpu-{socket.gethostname()}"
    gpu_type: str = "cpu"
    gpu_count: int = 1
    gpu_memory_gb: float = 0.0
    spot: bool = False
    interconnect_group: str = "local"
    heartbeat_s: float = 2.0
    progress_interval_s: float = 1.0
    scratch_dir: Path | None = None
    keep_scratch: bool = False
