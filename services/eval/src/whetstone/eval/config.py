from pathlib import Path
from typing import Any

from pydantic_settings import SettingsConfigDict
from whetstone.runtime.settings import ServiceSettings

from .adapters.benchmarks import SHIPPED_TASKS


class EvalSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="WHETSTONE_EVAL_", extra="ignore")
    http_port: int = 8103
    max_len: int = 512
    # stage 1: lm-eval task directory (shipped synthetic suites by default; `whet eval import-tasks`)
    task_dir: Path | None = SHIPPED_TASKS
    lm_eval_batch_size: int = 32
    # stage 3: harmful prompts (None: the shipped set) and an optional local HF model classifier
    safety_prompts: Path | None = None
    safety_classifier_model: str | None = None
    # stage 4: an OpenAI-compatible endpoint (base URL ending in /v1) or a local HF model
    judge_url: str | None = None
    judge_api_key: str = ""
    judge_model: str = ""
    judge_local_model: str | None = None
    judge_timeout_s: float = 30.0
    judge_sees_images: bool = False     # the judge endpoint is a vision model: held-out images are shown to it
    # gate policy: per-tenant defaults in eval_config shape, and tiers allowed to switch safety off
    tenant_defaults: dict[str, dict[str, Any]] = {}
    tiers_may_skip_safety: list[str] = []
    # the worker: claims with a lease renewed by heartbeats; a claim whose lease ran out is retried
    workers: int = 1
    lease_s: float = 60.0
    poll_s: float = 2.0
    max_attempts: int = 3
    # an attempt that failed because S3 or the database was unreachable is retried after a capped
    # exponential pause and does not count as a crash, until the outage has lasted transient_budget_s
    transient_backoff_s: float = 2.0
    transient_backoff_max_s: float = 60.0
    transient_budget_s: float = 900.0
