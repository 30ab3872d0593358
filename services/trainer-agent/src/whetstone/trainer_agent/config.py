import socket
from pathlib import Path
from typing import Literal

from pydantic import Field
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
    address: str = Field(default_factory=socket.getfqdn,
                         description="where the other nodes of a multi-node gang reach this one")
    heartbeat_s: float = 2.0
    progress_interval_s: float = 1.0
    scratch_dir: Path | None = None
    keep_scratch: bool = False
    keep_checkpoints: int = Field(default=3, ge=1, description="resumable checkpoints kept per job in S3")
    full_weights_max_shard_bytes: int | None = Field(
        default=None, gt=0, description="a full-weight model's final weights are saved as safetensors shards of at "
        "most this many bytes (with model.safetensors.index.json); unset: transformers' own shard size")
    launcher: Literal["torchrun", "deepspeed"] = Field(default="torchrun",
                                                       description="multi-GPU / multi-node launcher")
    recipe_module: str = "whetstone.trainer_agent.recipes.main"
    drain_timeout_s: float = Field(default=100.0, gt=0, description="SIGTERM -> emergency checkpoint uploaded; "
                                   "spot nodes get about 120 s of notice")
    collective_timeout_s: int = Field(default=600, gt=0, description="a gang's process-group timeout (torch."
                                      "distributed, gloo/NCCL): a rank waiting this long in a collective, or for a "
                                      "node that never joins the rendezvous, fails, and the gang is re-queued "
                                      "(node_lost) with the other nodes named")
    exit_grace_s: float = Field(default=60.0, gt=0, description="wait after a terminal event before SIGKILL")
    upload_attempts: int = Field(default=3, ge=1)
    final_upload_outage_s: float = Field(default=300.0, ge=0, description="how long the final checkpoint's (and merged "
                                         "weights') upload keeps retrying while S3 is unreachable, instead of "
                                         "failing a job whose training finished")
