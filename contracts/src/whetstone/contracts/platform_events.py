"""Events of the platform itself: usage metering, node heartbeats, dead letters."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from .base import Contract, Event
from .enums import ChargeClass, UsageScope, ValueEncoding

# ------------------------------------------------------------------ metering


class UsageMeteredV1(Event):
    EVENT_TYPE = "usage.metered"
    job_id: str
    scope: UsageScope
    segment_id: str | None = None
    gpu_type: str | None = None
    gpu_count: int = 0
    gpu_seconds: float
    billable_gpu_seconds: float
    charge_class: ChargeClass
    price_version: str
    cost: float
    currency: str = "USD"
    segments: int = 1


# --------------------------------------------------------------------- nodes


class GpuSample(Contract):
    """One GPU as `nvidia-smi --query-gpu` reports it (a field it cannot read is None)."""

    index: int = Field(ge=0)
    name: str | None = None
    utilization_pct: float | None = Field(default=None, ge=0)
    memory_used_mb: float | None = Field(default=None, ge=0)
    memory_total_mb: float | None = Field(default=None, ge=0)
    power_w: float | None = Field(default=None, ge=0)
    temperature_c: float | None = None


class NodeHeartbeatV1(Event):
    EVENT_TYPE = "node.heartbeat"
    node_id: str
    gpu_type: str
    gpu_count: int = Field(ge=0)
    gpu_memory_gb: float = 0
    free_gpu_ids: list[int] | None = Field(
        default=None, description="GPU ids the node can take new work on now (none while it drains); absent:"
                                  " not reported, the scheduler counts only what it placed there itself")
    draining: bool = Field(default=False, description="the node is stopping (drain, spot reclaim): it hands back"
                                                      " new assignments, so none is placed on it until it reports"
                                                      " otherwise")
    spot: bool = False
    interconnect_group: str = "default"
    running_jobs: list[str] = Field(default_factory=list)
    sent_at: datetime
    address: str | None = Field(
        default=None, description="host name or IP the other nodes of a multi-node gang reach this node at"
                                  " (rank 0 hosts the rendezvous); the node_id when absent")
    gpus: list[GpuSample] = Field(default_factory=list, description="per-GPU figures from nvidia-smi, when present")
    cpu_percent: float | None = Field(default=None, ge=0, description="node CPU busy %, since the last heartbeat")
    rss_mb: float | None = Field(default=None, ge=0, description="resident memory of the agent and its training processes")


# ---------------------------------------------------------------------- dlq


class DeadLetterV1(Event):
    EVENT_TYPE = "dead_letter"
    source_topic: str
    partition: int
    offset: int
    consumer: str
    attempts: int
    error: str
    key: str | None = None
    value: str = Field(description="the original record, at most 64 KiB of it: as text, or base64 (value_encoding)")
    value_encoding: ValueEncoding = ValueEncoding.UTF8
    value_bytes: int | None = Field(default=None, description="size of the whole original record")
    value_sha256: str | None = Field(default=None, description="sha256 of the whole original record")
    value_truncated: bool = False
