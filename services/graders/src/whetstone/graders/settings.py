"""Operator settings for graders (environment, prefix `WHETSTONE_GRADERS_`). Tenants never supply
endpoints: a score_model / label_model grader names a model, and only the models configured here
can be used; cosine similarity needs the embeddings endpoint configured here.

    WHETSTONE_GRADERS_JUDGES='{"judge-small": {"base_url": "http://serving:8000/v1", "api_key_env": "JUDGE_KEY"}}'
    WHETSTONE_GRADERS_EMBEDDINGS='{"base_url": "http://embed:8000/v1", "model": "bge-small"}'
    WHETSTONE_GRADERS_PYTHON_SANDBOX=bwrap | unsafe | off

API keys are read from the environment variable an endpoint names, at call time, and never
appear in a reply or a log line."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Endpoint(BaseModel):
    """An OpenAI-compatible endpoint (`/chat/completions` for judges, `/embeddings` for cosine)."""
    model_config = ConfigDict(extra="forbid")
    base_url: str = Field(min_length=1, description="up to and including /v1")
    model: str | None = Field(default=None, description="the upstream's model name (default: the name tenants use)")
    api_key_env: str | None = Field(default=None, description="environment variable holding the bearer key")
    timeout_s: float = Field(default=60.0, gt=0)
    max_tokens: int = Field(default=1024, ge=1, description="completion budget when the grader sets none")

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None


class PythonSandboxSettings(BaseModel):
    python_sandbox: Literal["bwrap", "unsafe", "off"] = "bwrap"
    python_executable: str | None = None
    timeout_s: float = Field(default=10.0, gt=0, description="wall time per grade() call")
    cpu_s: int = Field(default=5, ge=1)
    memory_mb: int = Field(default=512, ge=64)
    max_processes: int = Field(default=16, ge=1)
    uid_base: int | None = Field(default=200_000, description="when running as root: graders run as uid_base + slot")
    uid_count: int = Field(default=64, ge=1)
    concurrency: int = Field(default=4, ge=1, description="python graders running at once in this process")


class GraderSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WHETSTONE_GRADERS_", extra="ignore")
    judges: dict[str, Endpoint] = Field(default_factory=dict, description="model name -> judge endpoint")
    embeddings: Endpoint | None = None
    python_sandbox: Literal["bwrap", "unsafe", "off"] = "bwrap"
    python_executable: str | None = Field(default=None, description="interpreter graders run with (stdlib only)")
    python_timeout_s: float = Field(default=10.0, gt=0)
    python_cpu_s: int = Field(default=5, ge=1)
    python_memory_mb: int = Field(default=512, ge=64)
    python_max_processes: int = Field(default=16, ge=1)
    python_concurrency: int = Field(default=4, ge=1)

    def sandbox(self) -> PythonSandboxSettings:
        return PythonSandboxSettings(python_sandbox=self.python_sandbox, python_executable=self.python_executable,
                                     timeout_s=self.python_timeout_s,
                                     cpu_s=self.python_cpu_s, memory_mb=self.python_memory_mb,
                                     max_processes=self.python_max_processes, concurrency=self.python_concurrency)
