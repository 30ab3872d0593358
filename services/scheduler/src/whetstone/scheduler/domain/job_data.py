"""The typed parts of a job: what was asked (`JobRequest`), the resources admission planned
(`JobResources`), where a segment runs (`PlacedPart`), its latest checkpoint, progress, error and
quota record (pydantic models the job store maps to its JSON columns as they are) and a timeline
line (`Note`). Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from whetstone.contracts import CheckpointRef, JobRequestedV1, MergeSource, ResourceRequest
from whetstone.contracts.enums import CheckpointKind, ErrorClass, SpecMethod

from .placement import Shape
from .resources import MemoryEstimate, ModelArch


class Record(BaseModel):
    """A part of the job's state: immutable, replaced whole by the transitions."""

    model_config = ConfigDict(frozen=True)


class TemplateUse(Record):
    """The job template a job was created from and the fields the call overrode."""

    name: str
    version: int
    overrides: list[str] = Field(default_factory=list)


class JobRequest(JobRequestedV1):
    """The `job.requested` a job was created from, as the job keeps it, with what the API adds
    (metadata, the template used) and a merge job's source (`method` merge)."""

    method: SpecMethod = SpecMethod.LORA   # type: ignore[assignment]   # a merge job's too
    metadata: dict[str, str] | None = None
    template: TemplateUse | None = None
    merge: MergeSource | None = None

    @classmethod
    def of(cls, req: JobRequestedV1, metadata: dict[str, str] | None = None,
           template: TemplateUse | None = None) -> JobRequest:
        return cls(**dict(req), metadata=metadata or None, template=template)


class MemoryGb(Record):
    """resources.MemoryEstimate as recorded (GB, rounded), with its total."""

    weights: float = 0.0
    gradients: float = 0.0
    optimizer: float = 0.0
    adapter: float = 0.0
    activations: float = 0.0
    overhead: float = 0.0
    total: float = 0.0

    @classmethod
    def of(cls, m: MemoryEstimate) -> MemoryGb:
        return cls(weights=round(m.weights, 3), gradients=round(m.gradients, 3), optimizer=round(m.optimizer, 3),
                   adapter=round(m.adapter, 3), activations=round(m.activations, 3), overhead=round(m.overhead, 3),
                   total=round(m.total, 3))


class ArchRecord(Record):
    """The base model's dimensions admission read, and whether it sees images (None: unknown)."""

    vision: bool | None = None
    hidden_size: int | None = None
    num_layers: int | None = None
    vocab_size: int | None = None
    max_positions: int | None = None


class AssignedShape(Record):
    gpu_type: str
    gpus_per_node: int
    nodes: int = 1
    spot: bool = False


class JobResources(Record):
    """What admission planned: the request ("auto" or the tenant's shape), the acceptable shapes
    (most preferred first), the memory estimate and the base's size; `assigned` is the shape of the
    current segment."""

    request: ResourceRequest | Literal["auto"] = "auto"
    shapes: tuple[Shape, ...] = ()
    memory_gb: MemoryGb = Field(default_factory=MemoryGb)
    params: int = 0
    params_source: str = "unknown"
    arch: ArchRecord = Field(default_factory=ArchRecord)
    assigned: AssignedShape | None = None

    @classmethod
    def planned(cls, request: ResourceRequest | None, shapes: tuple[Shape, ...], memory: MemoryEstimate,
                model: ModelArch, vision: bool | None = None) -> JobResources:
        return cls(request=request or "auto", shapes=shapes, memory_gb=MemoryGb.of(memory), params=model.params,
                   params_source=model.source,
                   arch=ArchRecord(vision=vision, hidden_size=model.hidden_size, num_layers=model.num_layers,
                                   vocab_size=model.vocab_size, max_positions=model.max_positions))

    @property
    def model(self) -> ModelArch:
        """The base's architecture as admission recorded it."""
        a = self.arch
        return ModelArch(self.params, self.params_source, a.hidden_size, a.num_layers, a.vocab_size, a.max_positions)


class PlacedPart(Record):
    """One node of a segment's placement and the GPU ids it holds there."""

    node_id: str
    gpu_ids: list[int]


class StoredCheckpoint(Record):
    """The job's latest checkpoint: what a resumed segment starts from."""

    uri: str
    step: int
    manifest_sha256: str
    kind: CheckpointKind
    segment_id: str | None = None
    written_at: datetime | None = None

    def ref(self) -> CheckpointRef:
        return CheckpointRef(uri=self.uri, step=self.step, manifest_sha256=self.manifest_sha256)


class Progress(Record):
    """The latest step's figures (`job.progress`), and the total steps `job.started` announced."""

    step: int | None = None
    total_steps: int | None = None
    epoch: float | None = None
    loss: float | None = None
    grad_norm: float | None = None
    learning_rate: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    peak_memory_mb: float | None = None
    validation_loss: float | None = None
    tokens_seen: int | None = None
    token_accuracy: float | None = None
    gpu_utilization: float | None = None
    step_time_s: float | None = None
    mfu: float | None = None

    def fraction(self) -> float:
        if not self.step or not self.total_steps:
            return 0.0
        return min(1.0, self.step / self.total_steps)


class JobError(Record):
    code: str
    message: str
    error_class: ErrorClass = ErrorClass.USER
    param: str | None = None


class QuotaRecord(Record):
    """The quota check that admitted the job (domain.admission.QuotaVerdict, rounded)."""

    over_soft_quota: bool = False
    used_gpu_hours: float = 0.0
    estimated_gpu_hours: float = 0.0
    soft_gpu_hours: float | None = None
    hard_gpu_hours: float | None = None


@dataclass(frozen=True)
class TimelineEntry:
    """One stored line of a job's timeline (`fine_tuning.job.event`)."""

    id: int
    job_id: str
    created_at: datetime
    level: str
    message: str
    type: str
    data: dict[str, Any]


@dataclass(frozen=True)
class CheckpointEntry:
    """One checkpoint a job wrote, with the metrics measured at its step (`fine_tuning.job.checkpoint`)."""

    job_id: str
    checkpoint_id: str
    step: int
    kind: str
    uri: str
    created_at: datetime
    metrics: dict[str, float]



@dataclass
class Note:
    """One line of the job's timeline (shown as a fine_tuning.job.event)."""

    created_at: datetime
    message: str
    level: str = "info"
    type: str = "message"          # "message" | "metrics"
    data: dict[str, Any] = field(default_factory=dict)
